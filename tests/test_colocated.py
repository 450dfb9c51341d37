"""npusim plan (co-located by default): co-located deployments of the frontier's decode layouts served in the request-level
simulation beside the disaggregated recommendation, and the verdict; prefills sharing a co-located instance's steps
can only slow its decodes."""

import json

import pytest

from npusim import api

ARGS = ["plan", "--hw", "cloudmatrix384", "--model", "deepseek-v3.2-exp", "--input", "2048", "--output", "256",
        "--slo", "ttft=2s,tpot=50ms", "--ranks", "16,32", "--mtp", "0", "--workers", "1", "--requests", "40"]
# co-located deployments are searched by default (issue 17 item 1); --no-colocated skips their serving runs


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    from conftest import run_cli

    d = tmp_path_factory.mktemp("colocated")
    r = run_cli(*ARGS, "--out", d / "p.yaml", "--format", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout), d


def test_colocated_beside_disaggregated_with_a_verdict(planned):
    out, d = planned
    rows = out["colocated"]
    kinds = [r["deployment"] for r in rows]
    assert kinds[0] == "disaggregated" and "co-located" in kinds
    best = max((r for r in rows if r["deployment"] == "co-located" and r["ttft_p99_ms"] <= 2000
                and r["tpot_p99_ms"] <= 50), key=lambda r: r["served_tok_s_chip"], default=None)
    disagg = rows[0]
    assert best is not None and disagg["tpot_p99_ms"] <= 50
    winner = "co-located" if best["served_tok_s_chip"] > disagg["served_tok_s_chip"] else "disaggregated"
    assert out["verdict"].startswith(f"{winner} wins at the SLO (p99)")
    search = json.loads((d / "p.search.json").read_text())
    assert search["verdict"] == out["verdict"] and len(search["colocated"]) == len(rows)


def test_served_ttft_is_bounded_by_the_prefill_alone_and_halving_follows_a_miss(planned, tmp_path):
    """A request's first token needs its whole prefill: a co-located run's TTFT at p99 is no better than one prompt
    prefilled on the idle instance (predict's TTFT; 1 % for the serving step model's interpolation). The search
    halves a layout's batch only after the served run at the larger batch missed the SLO."""
    out, _ = planned
    rows = [r for r in out["colocated"] if r["deployment"] == "co-located"]
    for r in rows:
        ranks, rest = r["layout"].split("r ", 1)
        attn = rest.split()[0][2:]
        dp, tp = (int(x) for x in attn.split("xTP")) if "xTP" in attn else (int(attn), 1)
        o_tp, d_tp = (int(t[3:]) for t in rest.split()[2:4])
        plan = tmp_path / f"c{ranks}-{r['batch']}.yaml"
        plan.write_text(f"decode: {{ranks: {ranks}, attention: {{dp: {dp}, tp: {tp}}}, moe: {{ep: {ranks}}}, "
                        f"o_proj_tp: {o_tp}, dense_tp: {d_tp}, embed_tp: 16, lm_head_tp: 16}}\ncolocated: true\n"
                        "streams: {shared_expert_side_stream: true, comm_overlap: true}\n")
        alone = api.predict("cloudmatrix384", "deepseek-v3.2-exp", str(plan), input=2048, output=256, batch=1)
        assert r["ttft_p99_ms"] >= alone.ttft * 1e3 * 0.99, r
    for a, b in zip(rows, rows[1:]):  # fewer users only after a miss, more (bisecting) only after a meet
        if a["layout"] == b["layout"]:
            missed = a["ttft_p99_ms"] > 2000 or a["tpot_p99_ms"] > 50
            assert missed == (b["batch"] < a["batch"]), (a, b)


def test_served_tpot_is_worse_than_the_same_decode_alone(planned):
    """Each served co-located run carries its one-request bounds. Where a DP group holds more than one user, prompts
    run in its decode steps: TPOT worse than the same layout's decode step at that batch alone (predict), TTFT worse
    than one prompt prefilled alone."""
    out, _ = planned
    rows = [r for r in out["colocated"] if r["deployment"] == "co-located" and not r["note"]]
    assert rows and all(r["alone_tpot_ms"] > 0 and r["alone_ttft_ms"] > 0 for r in rows)
    assert all(r["tpot_p99_ms"] >= r["alone_tpot_ms"] * 0.99 for r in rows)
    dp = lambda r: int(r["layout"].split()[1][2:].split("xTP")[0])  # noqa: E731  '32r DP4xTP8 ...' -> 4
    shared = [r for r in rows if r["batch"] > dp(r)]  # some DP group runs a prompt beside its decodes
    assert shared and all(r["tpot_p99_ms"] > r["alone_tpot_ms"] * 1.01 for r in shared)
    assert all(r["ttft_p99_ms"] > r["alone_ttft_ms"] * 1.5 for r in shared)


def test_a_prompt_alone_above_the_ttft_limit_is_not_served(tmp_path):
    """TTFT 0.25 s: a 2K prompt prefilled alone on any co-located layout takes longer (no context parallelism; the
    fastest, 64r DP8xTP8, 0.27 s), so none is served; the verdict says so, and --figures draws the frontier."""
    from conftest import run_cli

    args = [a if a != "ttft=2s,tpot=50ms" else "ttft=0.25s,tpot=50ms" for a in ARGS]
    r = run_cli(*args, "--out", tmp_path / "p.yaml", "--figures", tmp_path / "fig", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    rows = [x for x in out["colocated"] if x["deployment"] == "co-located"]
    assert rows and all(x["note"].startswith("not served: one prompt alone takes") and x["alone_ttft_ms"] > 250
                        and x["ttft_p99_ms"] is None for x in rows)
    assert "no co-located candidate" in out["verdict"] and "one prompt alone takes" in out["verdict"]
    png = tmp_path / "fig" / "frontier.png"
    assert png.exists() and png.stat().st_size > 10_000


def test_the_colocated_chunk_is_sglangs_ascend_default():
    """SGLang's set_default_server_args on NPU: 4096 tokens at <= 32 GiB (910B4), 8192 at <= 64 GiB (910B1-B3, a
    910C die); the 950's 128 / 144 GiB fall to the GPU-memory rule's 8192. The planner takes it from the chip file."""
    from npusim.planner.colocated import GiB, sglang_chunk
    from npusim.spec.system import load_system

    assert [sglang_chunk(g * GiB) for g in (32, 64, 144)] == [4096, 8192, 8192]
    sizes = {hw: sglang_chunk(load_system(hw).chip_spec.hbm.capacity)
             for hw in ("cloudmatrix384", "atlas-800-a2", "atlas-950-superpod")}
    assert sizes == {"cloudmatrix384": 8192, "atlas-800-a2": 8192, "atlas-950-superpod": 8192}
    small = load_system("atlas-800-a2", {"hbm.capacity": "32 GiB", "hbm.usable": "30 GiB"})  # a 910B4's HBM
    assert sglang_chunk(small.chip_spec.hbm.capacity) == 4096


def test_no_colocated_skips_the_serving_runs_and_the_verdict(tmp_path):
    """--no-colocated: the disaggregated search and its confirming run only, no co-located rows or verdict."""
    from conftest import run_cli

    r = run_cli(*ARGS, "--no-colocated", "--out", tmp_path / "p.yaml", "--format", "json")
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert "colocated" not in out and "verdict" not in out and out["served"][-1]["under_load"] == "meets"
