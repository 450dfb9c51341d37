"""Launch commands (npusim plan / predict --emit): every flag written is one the framework documents, with a documented
value; the parallel layout of the published deployments comes back as their published flags; what a framework cannot
express is said, not approximated."""

import json
import shlex

import pytest

from npusim import api
from npusim.errors import NpusimError
from npusim.results.launch import Limits, launch, limits_for
from npusim.spec.framework import frameworks, load_framework
from npusim.spec.plan import PLANS

LIMITS = Limits(input=4096, output=1024, max_batch=8)
MODEL = {"r1": "deepseek-v3.1", "v32": "deepseek-v3.2-exp", "v4flash": "deepseek-v4-flash", "v4pro": "deepseek-v4-pro"}
HW = {"a3": "cloudmatrix384", "a2": "atlas-800-a2", "950dt": "atlas-950-superpod"}


def emitted(plan, framework, quant="w8a8", limits=LIMITS, hw=None):
    family, system = plan.split("-")[:2]
    grow = {"chips": "48"} if system == "a2" else None  # v32-a2-pd spans six Atlas 800 A2 nodes (its header)
    setup = api.load_setup(hw or HW[system], MODEL[family], plan, quant, grow)
    return launch(framework, setup.plan, setup.model, setup.quant, setup.system, limits)


def commands(script: str) -> list[list[str]]:
    """The script's commands as argument lists (comments dropped, continuations joined), program and env included."""
    blocks, current = [], []
    for line in script.splitlines():
        if line.startswith("#") or not line.strip():
            if current:
                blocks.append(" ".join(current))
                current = []
            continue
        current.append(line.rstrip("\\").strip())
    if current:
        blocks.append(" ".join(current))
    return [shlex.split(b) for b in blocks]


def flags(argv: list[str]) -> list[tuple[str, str | None]]:
    """(flag, value) pairs of one command after its program (a flag's following non-flag words are its value)."""
    start = next(i for i, w in enumerate(argv) if w in ("serve", "-m"))
    words = argv[start + 2:] if argv[start] == "serve" else argv[start + 2:]
    out = []
    for w in words:
        if w.startswith("--"):
            out.append([w, None])
        elif out:
            out[-1][1] = w if out[-1][1] is None else f"{out[-1][1]} {w}"
    return [tuple(x) for x in out]


def parsed(launch_):
    """{role: [flags of each command]} read back from the printed script."""
    out = {}
    cmds = commands(launch_.script())
    assert len(cmds) == sum(2 if c.worker_args else 1 for c in launch_.commands)
    it = iter(cmds)
    for c in launch_.commands:
        out.setdefault(c.role, []).append(dict(flags(next(it))))
        if c.worker_args:
            out[c.role].append(dict(flags(next(it))))
    return out


@pytest.mark.parametrize("framework", ["sglang", "vllm-ascend"])
@pytest.mark.parametrize("plan", sorted(p for p in PLANS.names() if p.split("-")[0] in MODEL))
def test_every_emitted_flag_is_documented(plan, framework):
    table = load_framework(framework)
    quant = "bf16" if plan.startswith("v4") else "w8a8c8"
    out = emitted(plan, framework, quant)
    for role, cmds in parsed(out).items():
        documented = table.router_flags if role == "router" else table.flags
        for fl in cmds:
            for name, value in fl.items():
                assert name in documented, f"{framework} {role}: {name} is not in the documented flag table"
                spec = documented[name]
                if spec.type == "json":
                    keys = _keys(json.loads(value))
                    assert set(keys) <= set(spec.keys), f"{name}: undocumented keys {set(keys) - set(spec.keys)}"
                elif spec.type == "choice":
                    assert value in spec.choices, f"{name} {value}"
                elif spec.type == "int":
                    assert value.lstrip("-").isdigit(), f"{name} {value}"
                elif spec.type == "bool":
                    assert value is None, f"{name} takes no value, got {value}"
    assert out.framework.version in out.script() and all(d in out.script() for d in out.framework.docs)


def _keys(tree, prefix=""):
    return [k for key, v in tree.items()
            for k in (_keys(v, f"{prefix}{key}.") if isinstance(v, dict) else [f"{prefix}{key}"])]


# The parallel flags of SGLang's published Ascend deployments (docs/platforms/ascend/ascend_npu_best_practice.md, as
# quoted in each plan file's header): the plan modelling each must give them back.
SGLANG_PUBLISHED = {
    "r1-a3-sglang-mixed-dp16": {"mixed": "--tp-size 16 --dp-size 16 --enable-dp-attention --enable-dp-lm-head "
                                          "--ep-size 16 --moe-a2a-backend deepep --deepep-mode auto "
                                          "--speculative-num-steps 3"},
    "r1-a3-sglang-mixed-tp4": {"mixed": "--tp-size 16 --dp-size 4 --enable-dp-attention --enable-dp-lm-head "
                                         "--ep-size 16 --moe-a2a-backend deepep --deepep-mode auto "
                                         "--speculative-num-steps 3"},
    "r1-a3-sglang-pd-w4a8": {"prefill": "--tp-size 16 --dp-size 2 --enable-dp-attention --moe-a2a-backend deepep "
                                        "--deepep-mode normal --speculative-num-steps 1",
                             "decode": "--tp-size 16 --dp-size 16 --enable-dp-attention --enable-dp-lm-head "
                                       "--ep-size 16 --moe-a2a-backend deepep --deepep-mode low_latency "
                                       "--speculative-num-steps 3"},
    "r1-a3-sglang-pd-tp2": {"prefill": "--tp-size 16 --dp-size 2 --enable-dp-attention --moe-a2a-backend deepep "
                                       "--deepep-mode normal --speculative-num-steps 1",
                            "decode": "--tp-size 32 --dp-size 16 --enable-dp-attention --enable-dp-lm-head "
                                      "--moe-dense-tp-size 1 --ep-size 32 --moe-a2a-backend deepep "
                                      "--deepep-mode low_latency --speculative-num-steps 3"},
    "v32-a3-sglang-pd-tp4": {"prefill": "--tp-size 32 --attn-cp-size 32 --enable-dsa-prefill-context-parallel "
                                        "--dsa-prefill-cp-mode in-seq-split --moe-a2a-backend deepep "
                                        "--deepep-mode normal --moe-dense-tp-size 1",
                             "decode": "--tp-size 32 --dp-size 8 --ep-size 32 --moe-dense-tp-size 1 "
                                       "--enable-dp-attention --enable-dp-lm-head --moe-a2a-backend deepep "
                                       "--deepep-mode low_latency --speculative-num-steps 3"},
}
PARALLEL = ("--tp-size", "--dp-size", "--enable-dp-attention", "--enable-dp-lm-head", "--moe-dense-tp-size",
            "--attn-cp-size", "--enable-dsa-prefill-context-parallel", "--deepep-mode", "--moe-a2a-backend",
            "--enable-two-batch-overlap")


@pytest.mark.parametrize("plan", sorted(SGLANG_PUBLISHED))
def test_sglang_published_deployments_come_back_as_published(plan):
    out = emitted(plan, "sglang")
    assert not [n for n in out.notes if "_tp" in n.split(":")[0]], out.notes  # every split is SGLang's own
    got = parsed(out)
    for role, text in SGLANG_PUBLISHED[plan].items():
        want = dict(flags(["python", "-m", "x"] + shlex.split(text)))
        have = got[role][0]
        for name, value in want.items():
            assert have.get(name, "absent") == value, f"{plan} {role}: {name}"
        for name in PARALLEL:  # and no parallel flag the published command does not pass
            assert name in want or name not in have, f"{plan} {role}: {name} {have[name]} not published"


def test_vllm_v32_tutorial_1p1d_comes_back_as_documented(tmp_path):
    """vllm-ascend tutorials/models/DeepSeek-V3.2.md §5.3: prefill DP2 x TP16 with DSA-CP, decode DP8 x TP4, MTP."""
    path = tmp_path / "tutorial.yaml"
    path.write_text("prefill: {ranks: 32, attention: {dp: 2, cp: 16}, moe: {ep: 32}, embed_tp: 16, lm_head_tp: 16,"
                    " o_proj_tp: 16, dense_tp: 16}\n"
                    "decode: {ranks: 32, attention: {dp: 8, tp: 4}, moe: {ep: 32}, embed_tp: 4, lm_head_tp: 4,"
                    " o_proj_tp: 4, dense_tp: 4}\n"
                    "mtp: {depth: 2, acceptance: 1.0}\n")
    setup = api.load_setup("cloudmatrix384", "deepseek-v3.2-exp", str(path), "w8a8")
    out = launch("vllm-ascend", setup.plan, setup.model, setup.quant, setup.system, Limits(65536, 3072, 4))
    got = parsed(out)
    pre, dec = got["prefill"][0], got["decode"][0]
    assert (pre["--data-parallel-size"], pre["--tensor-parallel-size"]) == ("2", "16")
    assert json.loads(pre["--additional-config"])["enable_dsa_cp"] is True
    assert "--enable-expert-parallel" in pre and "--enforce-eager" in pre
    assert (dec["--data-parallel-size"], dec["--tensor-parallel-size"]) == ("8", "4")
    assert json.loads(dec["--speculative-config"]) == {"num_speculative_tokens": 2, "method": "deepseek_mtp"}
    assert (dec["--max-num-seqs"], dec["--max-num-batched-tokens"]) == ("4", "12")  # 4 seqs x (1 + 2 drafts)
    kv = {r: json.loads(got[r][0]["--kv-transfer-config"]) for r in ("prefill", "decode")}
    assert (kv["prefill"]["kv_role"], kv["decode"]["kv_role"]) == ("kv_producer", "kv_consumer")
    assert kv["decode"]["kv_connector_extra_config"] == {"prefill": {"dp_size": 2, "tp_size": 16},
                                                         "decode": {"dp_size": 8, "tp_size": 4}}
    assert not [n for n in out.notes if "tp" in n.split(":")[0]]  # every split is expressible


def test_what_cannot_be_expressed_is_said():
    a17 = emitted("v32-a3-pd-a17", "sglang", "bf16")
    assert any(n.startswith("prefill.o_proj_tp 8") for n in a17.notes)  # SGLang: o_proj follows attention TP
    assert "Not expressible in SGLang" in a17.script()
    assert "--attn-cp-size" in a17.script()
    vl = emitted("v32-a3-pd-a17", "vllm-ascend", "bf16")
    fine = json.loads(parsed(vl)["decode"][0]["--additional-config"])["finegrained_tp_config"]
    assert fine == {"oproj_tensor_parallel_size": 8, "mlp_tensor_parallel_size": 4,
                    "embedding_tensor_parallel_size": 16, "lmhead_tensor_parallel_size": 16}
    assert any(n.startswith("prefill.o_proj_tp 8") for n in vl.notes)  # oproj TP only on a D node with TP 1
    r1 = emitted("r1-a3-prefill-a15", "vllm-ascend")
    assert any("two-microbatch" in n for n in r1.notes)


def test_prefill_cp_of_a_model_without_dsa_is_refused_by_vllm(tmp_path):
    path = tmp_path / "cp.yaml"
    path.write_text("prefill: {ranks: 16, attention: {cp: 16}, moe: {ep: 16}}\ndecode: {ranks: 16, attention: "
                    "{dp: 16}, moe: {ep: 16}}\n")
    setup = api.load_setup("cloudmatrix384", "deepseek-v3.1", str(path), "w8a8")
    out = launch("vllm-ascend", setup.plan, setup.model, setup.quant, setup.system, LIMITS)
    assert any("no prefill context parallelism" in n for n in out.notes)
    assert "enable_dsa_cp" not in out.script()


def test_the_flag_table_refuses_what_it_does_not_document():
    fw = load_framework("sglang")
    with pytest.raises(NpusimError, match="not in the documented flag table"):
        fw.check([("--enable-magic", None)])
    with pytest.raises(NpusimError, match="takes one of"):
        fw.check([("--moe-dense-tp-size", "4")])  # SGLang accepts only 1 (or the flag unset)
    assert frameworks() == ["sglang", "vllm-ascend"]


def test_limits_of_a_prediction():
    pl = PLANS.load("v32-a3-sglang-pd-tp4")
    lim = limits_for(pl, input=65536, output=3072, batch=32)
    assert lim.max_batch == 4 and lim.prefill_tokens == 65536  # 32 requests over the decode role's 8 DP ranks
    out = parsed(emitted("v32-a3-sglang-pd-tp4", "sglang", limits=lim))
    assert out["decode"][0]["--max-running-requests"] == "32"  # SGLang counts the whole server, as published


def test_cli_predict_and_plan_emit(cli, tmp_path):
    r = cli("predict", "--emit", "sglang", "--hw", "cloudmatrix384", "--model", "deepseek-v3.1", "--plan",
            "r1-a3-sglang-mixed-dp16", "--quant", "w4a8", "--input", "2048", "--output", "2048", "--batch", "256")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("#!/bin/bash") and "--max-running-requests 256" in r.stdout
    r = cli("predict", "--emit", "nope")
    assert r.returncode == 2 and "--emit" in r.stderr
    out = tmp_path / "p.yaml"
    r = cli("plan", "--hw", "cloudmatrix384", "--model", "deepseek-v3.2-exp", "--input", "2048", "--output", "256",
            "--slo", "ttft=1000s,tpot=1000s", "--ranks", "32", "--mtp", "0", "--workers", "1", "--out", out,
            "--emit", "sglang", "--emit", "vllm-ascend")
    assert r.returncode == 0, r.stderr
    for name in ("sglang", "vllm-ascend"):
        script = (tmp_path / f"p.{name}.sh").read_text()
        assert script in r.stdout and "plan p:" in script


def test_each_role_is_emitted_with_its_own_streams():
    setup = api.load_setup("cloudmatrix384", "deepseek-v3.1", "r1-a3-sglang-pd-tp2", "w8a8",
                           {"plan.prefill.streams.two_microbatch": "true"})
    roles = parsed(launch("sglang", setup.plan, setup.model, setup.quant, setup.system, LIMITS))
    assert "--enable-two-batch-overlap" in roles["prefill"][0]
    assert "--enable-two-batch-overlap" not in roles["decode"][0]  # the prefill's microbatches stay on prefill
