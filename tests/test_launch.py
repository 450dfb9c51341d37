"""Launch commands (npusim plan / predict --emit): every flag written is one the framework documents, with a documented
value, and one the named release (SGLang 0.5.23, vLLM 0.23.0 / vLLM-Ascend 0.23.0.post1, extracted from the packages
by scripts/framework_flags.py) has, neither hidden nor deprecated, with a value its validation accepts; the parallel
layout of the published deployments comes back as their published flags; what a framework cannot express is said,
not approximated, and a cache format it cannot store is refused."""

import importlib.util
import json
import math
import shlex
from pathlib import Path

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


def environment(argv: list[str]) -> dict[str, str]:
    """The NAME=value assignments before the command's program."""
    out = {}
    for w in argv:
        if "=" not in w or w.startswith("-"):
            break
        name, value = w.split("=", 1)
        out[name] = value
    return out


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
    quant = "bf16" if plan.startswith("v4") else "w8a8c8" if framework == "vllm-ascend" else "w8a8"
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
# quoted in each plan file's header): the plan modelling each must give them back, in SGLang 0.5.23's spelling
# (CURRENT: the published flags that 0.5.23 deprecates or no longer has, and what its server_args has instead).
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
CURRENT = {"--enable-dp-attention": [], "--dp-size": [("--attn-dp-size", None)],
           "--enable-dsa-prefill-context-parallel": [("--enable-prefill-cp", None)],
           "--dsa-prefill-cp-mode": [("--cp-strategy", {"in-seq-split": "zigzag"})]}
PARALLEL = ("--tp-size", "--attn-dp-size", "--enable-dp-lm-head", "--moe-dense-tp-size",
            "--attn-cp-size", "--enable-prefill-cp", "--cp-strategy", "--deepep-mode", "--moe-a2a-backend",
            "--enable-two-batch-overlap")


@pytest.mark.parametrize("plan", sorted(SGLANG_PUBLISHED))
def test_sglang_published_deployments_come_back_as_published(plan):
    out = emitted(plan, "sglang")
    assert not [n for n in out.notes if "_tp" in n.split(":")[0]], out.notes  # every split is SGLang's own
    got = parsed(out)
    for role, text in SGLANG_PUBLISHED[plan].items():
        want = dict(current(flags(["python", "-m", "x"] + shlex.split(text))))
        have = got[role][0]
        for name, value in want.items():
            assert have.get(name, "absent") == value, f"{plan} {role}: {name}"
        for name in PARALLEL:  # and no parallel flag the published command does not pass
            assert name in want or name not in have, f"{plan} {role}: {name} {have[name]} not published"


def current(published):
    """Published SGLang flags in 0.5.23's spelling (CURRENT)."""
    out = []
    for name, value in published:
        for new, values in CURRENT.get(name, [(name, None)]):
            out.append((new, values.get(value, value) if values else value))
    return out


def test_published_spellings_are_what_the_release_deprecates_or_dropped():
    release = load_framework("sglang").release
    assert "deprecated" in release.problem("--enable-dp-attention", None)
    assert "not a flag" in release.problem("--enable-dsa-prefill-context-parallel", None)
    assert "not a flag" in release.problem("--dsa-prefill-cp-mode", "in-seq-split")
    assert "deprecated" in release.problem("--disable-cuda-graph", None)
    assert "hidden" in release.problem("--forward-pass-metrics-worker-id", "1")
    assert "takes one of" in release.problem("--cp-strategy", "in-seq-split")
    assert release.problem("--cp-strategy", "zigzag") == release.problem("--attn-dp-size", "8") == ""


def test_vllm_v32_tutorial_1p1d_comes_back_as_documented(tmp_path):
    """vllm-ascend tutorials/models/DeepSeek-V3.2.md §5.3: prefill DP2 x TP16 with DSA-CP, decode DP8 x TP4, MTP."""
    path = tmp_path / "tutorial.yaml"
    path.write_text("prefill: {ranks: 32, attention: {dp: 2, cp: 16}, moe: {ep: 32}, embed_tp: 16, lm_head_tp: 16,"
                    " o_proj_tp: 1, dense_tp: 16}\n"
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


# The README's examples, as the planner recommends them (README "Capacity planning"): the 128K disaggregated plan and
# the 2K co-located winner.
README_PLANS = {
    "readme-128k": "prefill: {ranks: 256, instances: 2, attention: {cp: 256}, moe: {ep: 256}, o_proj_tp: 1,"
                   " embed_tp: 256, lm_head_tp: 256, dense_tp: 256}\n"
                   "decode: {ranks: 32, attention: {dp: 32}, moe: {ep: 32}, o_proj_tp: 8, dense_tp: 4, embed_tp: 1,"
                   " lm_head_tp: 1}\nmtp: {depth: 3, acceptance: 1.44}\n",
    "readme-2k-colocated": "decode: {ranks: 32, attention: {dp: 4, tp: 8}, moe: {ep: 32}, o_proj_tp: 8, dense_tp: 4}\n"
                           "colocated: true\n",
}


def _setups(tmp_path):
    """(name, setup, quant) of every shipped plan and of the README's, in each quantisation they are planned in."""
    out = []
    for plan in sorted(p for p in PLANS.names() if p.split("-")[0] in MODEL):
        family, system = plan.split("-")[:2]
        grow = {"chips": "48"} if system == "a2" else None
        for quant in (("bf16",) if family.startswith("v4") else ("w8a8", "w8a8c8")):
            out.append((plan, api.load_setup(HW[system], MODEL[family], plan, quant, grow), quant))
    for name, text in README_PLANS.items():
        path = tmp_path / f"{name}.yaml"
        path.write_text(text)
        for quant in ("w8a8", "w8a8c8"):
            out.append((name, api.load_setup("cloudmatrix384", "deepseek-v3.2-exp", str(path), quant), quant))
    return out


def sglang_rule_problems(flags_, env, ranks, setup) -> list[str]:
    """What SGLang 0.5.23's validation (parallel_hook.py, validation_hook.py) or the model would refuse, or what
    DeepEP's dispatch buffer would not hold, in one server's flags."""
    f, m, per_node = flags_, setup.model, setup.system.ranks_per_node
    tp, pp = int(f["--tp-size"]), int(f.get("--pp-size", 1))
    adp, cp, nnodes = int(f.get("--attn-dp-size", 1)), int(f.get("--attn-cp-size", 1)), int(f.get("--nnodes", 1))
    ep = int(f.get("--ep-size", 1))
    attn_tp = tp // (adp * cp) if tp % (adp * cp) == 0 else 0
    rules = {
        "tp x pp is the server's ranks": tp * pp == ranks,
        "tp_size divisible by attn_dp_size x attn_cp_size": attn_tp > 0,
        "the attention TP divides the heads": attn_tp and m.num_attention_heads % attn_tp == 0,
        "--enable-prefill-cp exactly with attn_cp_size > 1": ("--enable-prefill-cp" in f) == (cp > 1),
        "--cp-strategy set with --enable-prefill-cp": ("--enable-prefill-cp" not in f) or "--cp-strategy" in f,
        "moe_dense_tp_size in (None, 1, tp_size)": f.get("--moe-dense-tp-size", "1") in ("1", str(tp)),
        "tp x pp divisible by nnodes": (tp * pp) % nnodes == 0,
        "nnodes is the nodes the ranks fill": nnodes == math.ceil(ranks / per_node),
        "ep_size 1 or tp_size": ep in (1, tp),
        "experts (with redundant) divisible by ep_size":
            (m.n_routed_experts + int(f.get("--ep-num-redundant-experts", 0))) % ep == 0,
        "draft tokens are steps + 1": "--speculative-num-steps" not in f
            or int(f["--speculative-num-draft-tokens"]) == int(f["--speculative-num-steps"]) + 1,
    }
    if f.get("--deepep-mode") in ("low_latency", "auto"):
        per_group = math.ceil(int(f["--max-running-requests"]) / adp)
        tokens = per_group * int(f.get("--speculative-num-draft-tokens", 1))
        rules["DeepEP dispatch holds a decode step"] = (
            int(env.get("SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK", 128)) * attn_tp >= tokens)
    return [rule for rule, ok in rules.items() if not ok]


def vllm_rule_problems(flags_, env, ranks, role, setup) -> list[str]:
    """What vLLM 0.23.0's config checks (ModelConfig heads / TP, SchedulerConfig tokens / seqs) or the Mooncake
    connector's shape would refuse in one server's flags."""
    f, m = flags_, setup.model
    tp, dp, pp = int(f["--tensor-parallel-size"]), int(f.get("--data-parallel-size", 1)), \
        int(f.get("--pipeline-parallel-size", 1))
    rules = {
        "TP divides the attention heads": m.num_attention_heads % tp == 0,
        "DP x TP x PP is the server's ranks": dp * tp * pp == ranks,
        "max_num_batched_tokens >= max_num_seqs": int(f["--max-num-batched-tokens"]) >= int(f["--max-num-seqs"]),
        "EP divides the experts": "--enable-expert-parallel" not in f or m.n_routed_experts % (dp * tp) == 0,
    }
    if "--kv-transfer-config" in f:
        shape = json.loads(f["--kv-transfer-config"])["kv_connector_extra_config"][role]
        rules["the connector's shape is the server's"] = shape == {"dp_size": dp, "tp_size": tp}
    return [rule for rule, ok in rules.items() if not ok]


def test_every_emitted_command_passes_the_release(tmp_path):
    """Every shipped plan and the README's, in each framework: each flag is one of the release, neither hidden nor
    deprecated, with a value its choices and validation accept; each environment variable is read by the release or
    the Ascend runtime; both sides of a PD pair hold the cache format npusim sized; C8 caches SGLang cannot store are
    refused in one sentence."""
    checked = refused = 0
    for name, setup, quant in _setups(tmp_path):
        c8 = setup.quant.kv_cache.dtype == "int8"
        for framework in ("sglang", "vllm-ascend"):
            fw = load_framework(framework)
            out = launch(framework, setup.plan, setup.model, setup.quant, setup.system, LIMITS)
            if out.refused:
                refused += 1
                assert c8 and "C8" in out.refused and out.refused.count(". ") == 0, (name, out.refused)
                assert out.refused in out.script() and not out.commands
                continue
            assert not (c8 and framework == "sglang"), f"{name}: SGLang cannot store C8 caches"
            caches = set()
            argvs = iter(commands(out.script()))
            for c in out.commands:
                argv = next(argvs)
                if c.worker_args:
                    next(argvs)
                fl, env = dict(flags(argv)), environment(argv)
                if c.role == "router":
                    assert all(fw.router_release.problem(k, v) == "" for k, v in fl.items()), (name, fl)
                    continue
                for flag, value in fl.items():
                    assert fw.release.problem(flag, value) == "", (name, framework, flag, value)
                for var in env:
                    assert fw.env_problem(var) == "", (name, framework, var)
                if framework == "sglang":
                    problems = sglang_rule_problems(fl, env, c.ranks, setup)
                else:
                    problems = vllm_rule_problems(fl, env, c.ranks, c.role, setup)
                    extra = json.loads(fl.get("--additional-config", "{}"))
                    caches.add((extra.get("enable_sparse_sfa_c8", False), extra.get("enable_sparse_li_c8", False)))
                assert not problems, (name, framework, c.role, problems)
                checked += 1
            if framework == "vllm-ascend":
                assert caches == {(c8, c8)}, (name, caches)  # one cache format on every role, npusim's
    assert checked > 60 and refused > 10, (checked, refused)


def test_readme_128k_plan_on_vllm_keeps_heads_and_c8_on_both_sides(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(README_PLANS["readme-128k"])
    setup = api.load_setup("cloudmatrix384", "deepseek-v3.2-exp", str(path), "w8a8c8")
    out = launch("vllm-ascend", setup.plan, setup.model, setup.quant, setup.system, LIMITS)
    got = parsed(out)
    assert len(got["prefill"]) == 4 * 2  # 2 instances x 2 servers of DSA-CP 128, a head and a worker block each
    pre, dec = got["prefill"][0], got["decode"][0]
    assert (pre["--tensor-parallel-size"], pre.get("--data-parallel-size")) == ("128", None)
    assert any("servers of DSA-CP 128" in n and "not 256" in n for n in out.notes)
    for fl in (pre, dec):
        extra = json.loads(fl["--additional-config"])
        assert extra["enable_sparse_sfa_c8"] and extra["enable_sparse_li_c8"]
    assert json.loads(pre["--additional-config"])["enable_dsa_cp"] is True
    sgl = launch("sglang", setup.plan, setup.model, setup.quant, setup.system, LIMITS)
    assert sgl.refused and "BF16 caches" in sgl.script() and "--max-running-requests" not in sgl.script()


def test_readme_128k_plan_on_sglang_speaks_its_current_cp():
    setup = api.load_setup("cloudmatrix384", "deepseek-v3.2-exp", "v32-a3-sglang-pd-tp4", "w8a8")
    script = launch("sglang", setup.plan, setup.model, setup.quant, setup.system, LIMITS).script()
    assert "--enable-prefill-cp \\\n    --cp-strategy zigzag" in script
    for gone in ("dsa-prefill", "--enable-dp-attention", "--disable-cuda-graph"):
        assert gone not in script
    assert "SGLang 0.5.23" in script and "sglang-0.5.23.json" in script
    out = launch("sglang", setup.plan, setup.model, setup.quant, setup.system, Limits(131072, 1024, 4))
    got, env = parsed(out), {}
    dec = got["decode"][0]
    for argv in commands(out.script())[:2]:
        env[dict(flags(argv))["--disaggregation-mode"]] = environment(argv)
    # B's V3.2 decode: 4 requests per DP rank, 4 draft tokens, attention TP 4: 4 tokens per rank (B sets 8)
    assert env["decode"]["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] == "4" and dec["--attn-dp-size"] == "8"
    assert env["prefill"]["DEEP_NORMAL_MODE_USE_INT8_QUANT"] == "1" and env["prefill"]["HCCL_BUFFSIZE"] == "1536"
    eager = api.load_setup("cloudmatrix384", "deepseek-v3.2-exp", "v32-a3-sglang-pd-tp4", "w8a8",
                           {"plan.prefill.streams.graph_mode": "false"})
    pre = parsed(launch("sglang", eager.plan, eager.model, eager.quant, eager.system, LIMITS))["prefill"][0]
    assert pre["--cuda-graph-backend-decode"] == pre["--cuda-graph-backend-prefill"] == "disabled"


def _extractor():
    spec = importlib.util.spec_from_file_location("framework_flags", Path(__file__).parents[1] / "scripts"
                                                  / "framework_flags.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class _Source:
    """A package of source files for the extractor."""

    def __init__(self, files):
        self.files = {k: v.encode() for k, v in files.items()}

    tree = _extractor().Package.tree
    under = _extractor().Package.under


def test_extractor_reads_flags_as_argparse_would_register_them():
    ex = _extractor()
    pkg = _Source({
        "sglang/srt/arg_groups/choices.py": "MODES = ['a', 'b']\n",
        "sglang/srt/arg_groups/fields/p.py":
            "class P:\n"
            "    tp_size: A[int, Arg(help='TP.', aliases=['--tensor-parallel-size'])] = 1\n"
            "    mode: A[Optional[str], Arg(help='m', choices=MODES)] = None\n"
            "    kind: A[Literal['x', 'y'], 'k'] = 'x'\n"
            "    secret: A[int, Arg(help=argparse.SUPPRESS)] = 0\n"
            "    internal: A[bool, Arg(no_cli=True)] = False\n"
            "    on: A[Optional[bool], Arg(help='o', action=argparse.BooleanOptionalAction)] = None\n",
        "sglang/srt/server_args.py":
            "class ServerArgs:\n"
            "    def add_cli_args(parser):\n"
            "        parser.add_argument('--old', action=DeprecatedStoreTrueAction, help='Deprecated. Use --new.')\n",
    })
    flags_ = ex.sglang(pkg)["flags"]
    assert flags_["--tp-size"]["names"] == ["--tp-size", "--tensor-parallel-size"]
    assert flags_["--tp-size"]["type"] == "int"
    assert flags_["--mode"]["choices"] == ["a", "b"] and flags_["--kind"]["choices"] == ["x", "y"]
    assert flags_["--secret"]["hidden"] and flags_["--old"]["deprecated"] and "--internal" not in flags_
    assert flags_["--on"]["names"] == ["--on", "--no-on"] and flags_["--on"]["type"] == "bool"
    keys = ex.vllm_ascend(_Source({
        "vllm_ascend/ascend_config.py": "def f(additional_config):\n    g = additional_config.get('fine', {})\n"
                                        "    a = additional_config.get('top', 1)\n    b = g.get('inner', 0)\n",
        "vllm_ascend/utils.py": "def h(additional_config):\n    return 'flag' in additional_config\n"}))
    assert keys["additional_config"] == ["fine", "fine.inner", "flag", "top"]


def test_extracted_flag_sets_name_their_package():
    root = Path(__file__).parents[1] / "workloads" / "frameworks" / "flags"
    for name, version in (("sglang", "0.5.23"), ("vllm", "0.23.0"), ("vllm-ascend", "0.23.0.post1"),
                          ("sglang-router", "0.3.2")):
        data = json.loads((root / f"{name}-{version}.json").read_text())
        assert data["version"] == version and data["package"].replace("_", "-").startswith(f"{name}-{version}")
        assert len(data["sha256"]) == 64 and data["sources"] and (data.get("env") or name == "sglang-router")
    sgl = json.loads((root / "sglang-0.5.23.json").read_text())["flags"]
    assert sgl["--attn-cp-size"]["names"] == ["--attn-cp-size", "--attention-context-parallel-size"]
    assert sgl["--enable-dp-attention"]["deprecated"] and "--enable-dsa-prefill-context-parallel" not in sgl


def _read_back(out, tmp_path, name="launch"):
    from npusim.deploy.read import read_launch
    from npusim.planner.space import MTP_ACCEPTANCE
    path = tmp_path / f"{name}.sh"
    path.write_text(out.script())
    return read_launch(path, MTP_ACCEPTANCE)


def _load_tree(tree, tmp_path, name):
    import yaml
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tree, sort_keys=False))
    return str(path)


def _fields(plan, role):
    """The parts of a role a launch carries: layout, instances, the splits of every layer, MTP depth, graph mode."""
    inst = plan.instance(role)
    a, st = inst.attention, plan.streams_of("prefill" if role == "prefill" else "decode")
    return {"layout": (inst.ranks, inst.pp, inst.instances, a.dp, a.tp, a.cp), "moe.ep": inst.moe.ep,
            "o_proj_tp": inst.o_proj_group, "dense_tp": inst.dense_tp, "embed_tp": inst.embed_tp,
            "lm_head_tp": inst.lm_head_tp, "mtp": plan.mtp.depth if role != "prefill" else None,
            "streams.graph_mode": st.graph_mode}


def _noted(notes, role, field):
    head = {"layout": ("attention", "ffn_ranks", ":"), "moe.ep": ("moe.ep",), "streams.graph_mode": ("streams",)}
    keys = head.get(field, (field,))
    return any(n.split(":")[0].startswith(role) and any(k in n.split(":")[0] for k in keys) for n in notes) or \
        any(n.startswith("the plan is decode-only") for n in notes)


def test_emitted_launches_read_back_as_their_plans(tmp_path):
    """plan -> emit -> read: every shipped plan and the README's, in both frameworks, reads back as the same plan in
    every part the launch carries (the parts the launch says it cannot express excepted)."""
    compared = 0
    for name, setup, quant in _setups(tmp_path):
        if quant == "w8a8c8":
            continue
        for framework in ("sglang", "vllm-ascend"):
            out = launch(framework, setup.plan, setup.model, setup.quant, setup.system, LIMITS)
            dep = _read_back(out, tmp_path)
            assert not dep.unknown and not dep.unmodelled, (name, framework, dep.unknown, dep.unmodelled)
            back = api.load_setup(setup.system.name, setup.model.name, _load_tree(dep.plan, tmp_path, name),
                                  setup.quant.name, {"chips": str(setup.system.chips)} if "a2" in name else None)
            pl = setup.plan  # the emitter's roles: prefill and decode, one mixed server, or decode servers only
            roles = [("prefill", "prefill"), ("decode", "decode")] if pl.disaggregated else \
                [("decode", "mixed" if pl.runs_prefill else "decode")]
            for role, server in roles:
                want, got = _fields(setup.plan, role), _fields(back.plan, role)
                for field_, value in want.items():
                    moot = field_ == "mtp" or (field_ == "dense_tp" and not setup.model.first_k_dense_replace)
                    if not _noted(out.notes, server, field_) and not moot:
                        assert got[field_] == value, (name, framework, role, field_, value, got[field_])
                        compared += 1
            assert back.plan.mtp.depth == setup.plan.mtp.depth, (name, framework)
            assert dep.context_length == LIMITS.context_length
    assert compared > 200, compared


@pytest.mark.slow
def test_a_read_launch_predicts_as_its_plan(tmp_path):
    """The same prediction through the launch: SGLang's R1 PD deployment, vLLM-Ascend's V3.2 1P1D tutorial."""
    tutorial = tmp_path / "v32-tutorial.yaml"
    tutorial.write_text("prefill: {ranks: 32, attention: {dp: 2, cp: 16}, moe: {ep: 32}, embed_tp: 16, lm_head_tp: 16,"
                        " o_proj_tp: 1, dense_tp: 16}\n"
                        "decode: {ranks: 32, attention: {dp: 8, tp: 4}, moe: {ep: 32}, embed_tp: 4, lm_head_tp: 4,"
                        " o_proj_tp: 4, dense_tp: 4}\nmtp: {depth: 3, acceptance: 1.44}\n")
    for framework, plan, quant in (("sglang", "r1-a3-sglang-pd-tp2", "w8a8"),
                                   ("vllm-ascend", str(tutorial), "w8a8c8")):
        model = MODEL[Path(plan).name.split("-")[0]]
        setup = api.load_setup("cloudmatrix384", model, plan, quant)
        out = launch(framework, setup.plan, setup.model, setup.quant, setup.system, LIMITS)
        dep = _read_back(out, tmp_path, framework)
        same = {"plan.mtp.acceptance": str(setup.plan.mtp.acceptance)}  # not a launch flag
        if framework == "vllm-ascend":
            same["plan.prefill.streams.graph_mode"] = "false"  # the launch runs the P node eager (said in its notes)
        want = api.predict("cloudmatrix384", model, plan, input=4096, output=1024, batch=dep.batch, quant=quant,
                           overrides=same if framework == "vllm-ascend" else None)
        got = api.predict("cloudmatrix384", model, _load_tree(dep.plan, tmp_path, framework), input=4096,
                          output=1024, batch=dep.batch, quant=dep.quant, overrides=same)
        assert dep.batch == LIMITS.max_batch * setup.plan.decode.attention.dp * setup.plan.decode.instances
        assert (got.ttft, got.tpot) == pytest.approx((want.ttft, want.tpot), rel=1e-9), (framework, plan)


# Launch commands as the frameworks' docs print them (excerpts, the flags as written): SGLang's
# docs/platforms/ascend/ascend_npu_best_practice.md @ 0d04dc9, "DeepSeek-V3.2 128K-1K 20ms on A3 32 Cards
# Disaggregation Mode", and vLLM-Ascend 0.23.0.post1's docs/source/tutorials/models/DeepSeek-V3.2.md multi-node DP.
SGLANG_V32_DOC = r"""
export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True
P_IP=('your prefill ip1' 'your prefill ip2')
D_IP=('your decode ip1' 'your decode ip2')
MODEL_PATH=xxx
for i in "${!P_IP[@]}";
do
    if [[ "$LOCAL_HOST1" == "${P_IP[$i]}" || "$LOCAL_HOST2" == "${P_IP[$i]}" ]];
    then
        export HCCL_BUFFSIZE=1200
        python3 -m sglang.launch_server --model-path ${MODEL_PATH} \
        --tp 32 \
        --trust-remote-code \
        --attention-backend ascend \
        --device npu \
        --watchdog-timeout 9000 \
        --host ${P_IP[$i]} --port 8000 \
        --mem-fraction-static 0.73 \
        --disable-radix-cache --chunked-prefill-size -1 --max-prefill-tokens 68000 \
        --max-running-requests 1 \
        --moe-a2a-backend deepep --deepep-mode normal \
        --quantization modelslim \
        --disaggregation-transfer-backend ascend \
        --disaggregation-mode prefill \
        --disable-cuda-graph \
        --nnodes 2 --node-rank $i \
        --disaggregation-bootstrap-port 8995 \
        --moe-dense-tp-size 1 \
        --enable-nsa-prefill-context-parallel \
        --nsa-prefill-cp-mode in-seq-split \
        --attn-cp-size 32 \
        --speculative-algorithm NEXTN --speculative-num-steps 1 --speculative-eagle-topk 1 \
        --speculative-num-draft-tokens 2 \
        --dist-init-addr ${P_IP[0]}:10000
        break
    fi
done
for i in "${!D_IP[@]}";
do
    if [[ "$LOCAL_HOST1" == "${D_IP[$i]}" || "$LOCAL_HOST2" == "${D_IP[$i]}" ]];
    then
        DP=8
        export HCCL_BUFFSIZE=400
        export SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK=8
        python3 -m sglang.launch_server --model-path ${MODEL_PATH} \
        --tp 32 \
        --dp ${DP} \
        --ep 32 \
        --moe-dense-tp-size 1 \
        --enable-dp-attention \
        --enable-dp-lm-head \
        --trust-remote-code \
        --attention-backend ascend \
        --device npu \
        --watchdog-timeout 9000 \
        --host ${D_IP[$i]} --port 8001 \
        --mem-fraction-static 0.79 \
        --disable-radix-cache \
        --chunked-prefill-size -1 --max-prefill-tokens 68000 \
        --max-running-requests 32 \
        --cuda-graph-max-bs 4 \
        --moe-a2a-backend deepep \
        --deepep-mode low_latency \
        --quantization modelslim \
        --speculative-algorithm NEXTN --speculative-num-steps 3 --speculative-eagle-topk 1 \
        --speculative-num-draft-tokens 4 \
        --disaggregation-transfer-backend ascend \
        --disaggregation-mode decode \
        --nnodes 2 --node-rank $i \
        --dist-init-addr ${D_IP[0]}:10000
        break
    fi
done
python -m sglang_router.launch_router --pd-disaggregation --policy cache_aware --prefill http://P_IP1:8000 8995 \
    --decode http://D_IP1:8001 --host 127.0.0.1 --port 6688 --mini-lb
"""

VLLM_V32_DOC = r"""
export HCCL_BUFFSIZE=200
vllm serve /root/.cache/modelscope/hub/models/vllm-ascend/DeepSeek-V3.2-W8A8 \
--host 0.0.0.0 \
--port 8077 \
--data-parallel-size 2 \
--data-parallel-size-local 1 \
--data-parallel-address $node0_ip \
--data-parallel-rpc-port 12890 \
--tensor-parallel-size 16 \
--quantization ascend \
--seed 1024 \
--served-model-name deepseek_v3_2 \
--enable-expert-parallel \
--max-num-seqs 16 \
--max-model-len 8192 \
--max-num-batched-tokens 4096 \
--trust-remote-code \
--no-enable-prefix-caching \
--gpu-memory-utilization 0.92 \
--compilation-config '{"cudagraph_mode": "FULL_DECODE_ONLY"}' \
--speculative-config '{"num_speculative_tokens": 3, "method": "deepseek_mtp"}'

vllm serve /root/.cache/modelscope/hub/models/vllm-ascend/DeepSeek-V3.2-W8A8 \
--host 0.0.0.0 \
--port 8077 \
--headless \
--data-parallel-size 2 \
--data-parallel-size-local 1 \
--data-parallel-start-rank 1 \
--data-parallel-address $node0_ip \
--data-parallel-rpc-port 12890 \
--tensor-parallel-size 16 \
--quantization ascend \
--enable-expert-parallel \
--max-num-seqs 16 \
--max-model-len 8192 \
--speculative-config '{"num_speculative_tokens": 3, "method": "deepseek_mtp"}'
"""


def _read_doc(text, tmp_path, name):
    from npusim.deploy.read import read_launch
    from npusim.planner.space import MTP_ACCEPTANCE
    path = tmp_path / f"{name}.sh"
    path.write_text(text)
    return read_launch(path, MTP_ACCEPTANCE)


def test_sglang_best_practice_v32_launch_reads_as_its_deployment(tmp_path):
    dep = _read_doc(SGLANG_V32_DOC, tmp_path, "sglang-v32")
    pre, dec = dep.plan["prefill"], dep.plan["decode"]
    assert (pre["ranks"], pre["attention"], pre["moe"]["ep"], pre["dense_tp"]) == (32, {"cp": 32}, 32, 1)
    assert pre["streams"] == {"graph_mode": False} and "instances" not in pre  # one server on its 2 nodes
    assert (dec["ranks"], dec["attention"], dec["moe"], dec["lm_head_tp"]) == (32, {"dp": 8, "tp": 4}, {"ep": 32}, 4)
    assert dep.plan["mtp"]["depth"] == 3 and dep.batch == 32 and dep.quant == "w8a8"
    assert {"--enable-nsa-prefill-context-parallel", "--nsa-prefill-cp-mode", "--cuda-graph-max-bs"} <= set(
        dep.unknown)  # the old CP spelling is gone in 0.5.23; --cuda-graph-max-bs is now -decode / -prefill
    assert {"--watchdog-timeout", "--mem-fraction-static"} <= set(dep.unmodelled)
    setup = api.load_setup("cloudmatrix384", "deepseek-v3.2-exp", _load_tree(dep.plan, tmp_path, "sgl"), dep.quant)
    assert setup.plan.disaggregated and setup.plan.decode.attention.tp == 4


def test_vllm_tutorial_v32_launch_reads_as_its_deployment(tmp_path):
    dep = _read_doc(VLLM_V32_DOC, tmp_path, "vllm-v32")
    assert dep.plan["colocated"] is True and "prefill" not in dep.plan
    dec = dep.plan["decode"]
    assert (dec["ranks"], dec["attention"], dec["moe"], dec.get("instances", 1)) == (32, {"dp": 2, "tp": 16},
                                                                                       {"ep": 32}, 1)
    assert dep.plan["mtp"]["depth"] == 3 and dep.batch == 32 and dep.context_length == 8192
    assert not dep.unknown and "--gpu-memory-utilization" in dep.unmodelled and dep.quant == "w8a8"
    api.load_setup("cloudmatrix384", "deepseek-v3.2-exp", _load_tree(dep.plan, tmp_path, "vl"), dep.quant)


def test_a_launch_whose_values_are_template_arguments_is_refused(tmp_path):
    with pytest.raises(NpusimError, match=r"--tensor-parallel-size \$7: a shell variable"):
        _read_doc('vllm serve m --data-parallel-size 2 --tensor-parallel-size $7 --kv-transfer-config '
                  '\'{"kv_role": "kv_producer"}\'\n', tmp_path, "template")


@pytest.mark.slow
def test_cli_predict_launch_predicts_the_launched_plan(cli, tmp_path):
    """npusim predict --launch: SGLang's R1 PD commands as emitted predict as the plan they came from."""
    setup = api.load_setup("cloudmatrix384", "deepseek-v3.1", "r1-a3-sglang-pd-tp2", "w8a8")
    script = tmp_path / "r1.sh"
    script.write_text(launch("sglang", setup.plan, setup.model, setup.quant, setup.system, LIMITS).script())
    base = ["--hw", "cloudmatrix384", "--model", "deepseek-v3.1", "--input", "4096", "--output", "1024",
            "--format", "json", "--set", f"plan.mtp.acceptance={setup.plan.mtp.acceptance}"]
    r = cli("predict", "--launch", script, *base)
    assert r.returncode == 0, r.stderr
    assert "read " in r.stderr and "quant w8a8, batch 128" in r.stderr
    want = cli("predict", "--plan", "r1-a3-sglang-pd-tp2", "--quant", "w8a8", "--batch", "128", *base)
    got, exp = json.loads(r.stdout), json.loads(want.stdout)
    figures = ("ttft_s", "tpot_s")
    assert [got["summary"][k] for k in figures] == [exp["summary"][k] for k in figures]
    r = cli("predict", "--launch", tmp_path / "missing.sh")
    assert r.returncode == 2 and "--launch" in r.stderr and "no such file" in r.stderr


def test_cli_serve_launch_takes_the_framework_and_names_what_it_reads(cli, tmp_path):
    doc = tmp_path / "v32.sh"
    doc.write_text(SGLANG_V32_DOC)
    r = cli("serve", "--launch", doc, "--hw", "cloudmatrix384", "--model", "deepseek-v3.2-exp", "--concurrency", "2",
            "--requests", "2", "--input", "2048", "--output", "8", "--format", "json")
    assert r.returncode == 0, r.stderr
    assert "(sglang)" in r.stderr and "scheduler sglang" in r.stderr
    assert "--enable-nsa-prefill-context-parallel" in r.stderr  # unknown to 0.5.23, named


def test_an_eagle3_plan_launches_its_draft_model():
    setup = api.load_setup("cloudmatrix384", "deepseek-v3.1", "r1-a3-sglang-pd-tp2", "w8a8",
                           {"plan.mtp.draft": "workloads/models/hf/drafts/Kimi-K2-EAGLE3/config.json"})
    sgl = parsed(launch("sglang", setup.plan, setup.model, setup.quant, setup.system, LIMITS))["decode"][0]
    assert (sgl["--speculative-algorithm"], sgl["--speculative-draft-model-path"]) == ("EAGLE3", "$DRAFT_MODEL_PATH")
    vl = parsed(launch("vllm-ascend", setup.plan, setup.model, setup.quant, setup.system, LIMITS))["decode"][0]
    assert json.loads(vl["--speculative-config"]) == {"num_speculative_tokens": 3, "method": "eagle3",
                                                      "model": "$DRAFT_MODEL_PATH"}
