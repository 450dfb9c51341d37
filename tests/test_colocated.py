"""npusim plan --colocated: co-located deployments of the frontier's decode layouts served in the request-level
simulation beside the disaggregated recommendation, and the verdict; prefills sharing a co-located instance's steps
can only slow its decodes."""

import json

import pytest

from npusim import api

ARGS = ["plan", "--hw", "cloudmatrix384", "--model", "deepseek-v3.2-exp", "--input", "2048", "--output", "256",
        "--slo", "ttft=2s,tpot=50ms", "--ranks", "16,32", "--mtp", "0", "--workers", "1", "--colocated",
        "--requests", "40"]


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    from tests.conftest import run_cli

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
