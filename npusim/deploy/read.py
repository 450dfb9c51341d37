"""Reading a user's launch: SGLang or vLLM-Ascend server commands (a script, or the commands of a framework's docs)
as the deployment npusim predicts — its plan, quantisation, decode batch and context — with the flags it cannot
read.

The flags are read as the release's parser would (workloads/frameworks/flags/: every alias, and argparse's unique
prefixes such as SGLang's `--tp`); each server command becomes an instance of its role (SGLang
--disaggregation-mode, vLLM's kv_role), its copies the role's instances. The mapping is the inverse of
npusim.results.launch's: what the emitter writes for a plan reads back as that plan. What the release does not know
is named as unknown; what it knows but npusim does not model (memory fractions, graph batch sizes, timeouts, ...)
is named as not modelled.

Limits: a checkpoint's format is not in the flags — `--quantization modelslim` / `ascend` reads as W8A8 (C8 when
vLLM-Ascend's sparse C8 caches are on); the MTP acceptance is not either, the caller's table gives it per depth. A
shell loop over an address array (the docs' `for i in "${!P_IP[@]}"`) runs its command once per address.
"""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from npusim.errors import NpusimError
from npusim.spec.framework import Framework, load_framework

PROGRAMS = {"sglang.launch_server": "sglang", "serve": "vllm-ascend"}
EAGLE3 = ("the drafts come from an EAGLE-3 draft model, read as the model's own MTP layer: set plan.mtp.draft to "
          "the draft's config.json (--set plan.mtp.draft=...)")

# Flags npusim reads into the deployment; any other flag the release knows is reported as not modelled.
READ = {
    "sglang": {"--tp-size", "--pp-size", "--dp-size", "--enable-dp-attention", "--attn-dp-size", "--attn-cp-size",
               "--enable-prefill-cp", "--cp-strategy", "--ep-size", "--moe-a2a-backend", "--deepep-mode",
               "--moe-dense-tp-size", "--enable-dp-lm-head", "--enable-two-batch-overlap", "--speculative-algorithm",
               "--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens",
               "--disable-cuda-graph", "--cuda-graph-backend-decode", "--cuda-graph-backend-prefill",
               "--max-running-requests", "--max-prefill-tokens", "--chunked-prefill-size", "--context-length",
               "--ep-num-redundant-experts", "--quantization", "--dtype", "--disaggregation-mode", "--nnodes",
               "--node-rank", "--model-path", "--host", "--port", "--dist-init-addr", "--base-gpu-id",
               "--disaggregation-transfer-backend", "--disaggregation-bootstrap-port", "--trust-remote-code",
               "--attention-backend", "--device", "--disable-radix-cache"},
    "vllm-ascend": {"--tensor-parallel-size", "--data-parallel-size", "--pipeline-parallel-size",
                    "--enable-expert-parallel", "--speculative-config", "--enforce-eager", "--compilation-config",
                    "--max-num-seqs", "--max-num-batched-tokens", "--max-model-len", "--quantization",
                    "--kv-transfer-config", "--additional-config", "--enable-eplb", "--eplb-config", "--headless",
                    "--data-parallel-size-local", "--data-parallel-start-rank", "--data-parallel-rank",
                    "--data-parallel-address", "--data-parallel-rpc-port", "--host", "--port", "--nnodes",
                    "--node-rank", "--master-addr", "--master-port", "--distributed-executor-backend",
                    "--trust-remote-code", "--enable-prefix-caching", "--served-model-name", "--seed"},
}


@dataclass(frozen=True)
class Server:
    """One server command: its framework, role, flags (canonical names) and how many times the script runs it."""

    framework: str
    role: str  # prefill | decode | mixed
    flags: dict[str, str | None]
    copies: int = 1
    worker: bool = False  # a vLLM headless worker of a server launched elsewhere


@dataclass(frozen=True)
class Deployment:
    """What a launch deploys, as npusim predicts it."""

    framework: str
    plan: dict  # a plan file's tree
    quant: str
    batch: int  # global decode batch: the decode role's running requests over all its instances
    context_length: int
    unknown: tuple[str, ...] = ()  # flags the release does not have
    unmodelled: tuple[str, ...] = ()  # flags the release has and npusim does not model
    notes: tuple[str, ...] = field(default_factory=tuple)


def read_launch(path: str | Path, acceptance: dict[int, float]) -> Deployment:
    """The deployment of the launch script at `path`; MTP acceptance by depth from `acceptance`."""
    if not Path(path).is_file():
        raise NpusimError(f"no such file: {path}", field="--launch")
    text = Path(path).read_text()
    servers, unknown, unmodelled = [], [], []
    for fw_name, argv, copies in _commands(text):
        fw = load_framework(fw_name)
        flags = _flags(argv, fw, unknown, unmodelled)
        servers.append(Server(fw_name, _role(fw_name, flags), flags, copies, "--headless" in flags))
    heads = [s for s in servers if not s.worker]
    if not heads:
        raise NpusimError("has no SGLang (python -m sglang.launch_server) or vLLM (vllm serve) server command",
                          file=str(path))
    frameworks = {s.framework for s in heads}
    if len(frameworks) > 1:
        raise NpusimError(f"mixes frameworks ({', '.join(sorted(frameworks))}); give one framework's commands",
                          file=str(path))
    reader = SGLANG if heads[0].framework == "sglang" else VLLM
    return reader(heads, acceptance, tuple(dict.fromkeys(unknown)), tuple(dict.fromkeys(unmodelled)))


# ------------------------------------------------------------------------------------------------ the script

def _commands(text: str):
    """(framework, argv after the program, times run) of each server command of a shell script."""
    arrays = {m.group(1): len(shlex.split(m.group(2))) for m in re.finditer(r"^\s*(\w+)=\((.*)\)\s*$", text, re.M)}
    scalars = {m.group(1): m.group(2) for m in re.finditer(r"^\s*(?:export\s+)?(\w+)=([\w.:/-]+)\s*$", text, re.M)}
    for line in _logical_lines(text):
        line = re.sub(r"\$\{?(\w+)\}?(?!\[)", lambda m: scalars.get(m.group(1), m.group(0)), line)
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        for i, w in enumerate(words):
            if w in PROGRAMS and (w != "serve" or (i and words[i - 1].endswith("vllm"))):
                if w == "serve":
                    rest = words[i + 1:]
                    rest = rest[1:] if rest and not rest[0].startswith("-") else rest  # the model
                else:
                    rest = words[i + 1:]
                loops = [arrays[a] for a in re.findall(r"\$\{(\w+)\[\$i\]\}", line) if a in arrays]
                yield PROGRAMS[w], rest, max(loops, default=1)
                break


def _logical_lines(text: str) -> list[str]:
    """Lines joined over backslash continuations and over quotes left open (a JSON value written across lines)."""
    out, current = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        current += (" " if current else "") + (stripped[:-1] if stripped.endswith("\\") else stripped)
        if stripped.endswith("\\"):
            continue
        try:
            shlex.split(current, comments=True)
        except ValueError:
            continue  # an open quote: the value goes on
        out.append(current)
        current = ""
    return out + ([current] if current else [])


def _flags(argv: list[str], fw: Framework, unknown: list, unmodelled: list) -> dict[str, str | None]:
    """Flags by canonical name (aliases and unique prefixes resolved as argparse does), values joined."""
    out: dict[str, str | None] = {}
    name = None
    for w in argv:
        if w.startswith("-") and not _number(w):
            raw, _, value = w.partition("=")
            name = _canonical(raw, fw)
            if name is None:
                unknown.append(raw)
            elif name not in READ[fw.name]:
                unmodelled.append(name)
            if name is not None:
                out[name] = value or None
            if value:
                name = None
        elif name is not None:
            out[name] = w if out[name] is None else f"{out[name]} {w}"
    return out


def _number(word: str) -> bool:
    return bool(re.fullmatch(r"-\d+(\.\d+)?", word))


def _canonical(name: str, fw: Framework) -> str | None:
    """A flag's first name in the release: by any of its names, or by a prefix that only one flag's names start
    with (argparse's abbreviations); None if the release has no such flag."""
    flags = fw.release.flags
    if name in flags:
        return flags[name]["names"][0]
    found = {rec["names"][0] for alias, rec in flags.items() if alias.startswith(name)}
    return found.pop() if len(found) == 1 else None


def _role(framework: str, flags: dict) -> str:
    if framework == "sglang":
        return {"prefill": "prefill", "decode": "decode"}.get(flags.get("--disaggregation-mode"), "mixed")
    kv = flags.get("--kv-transfer-config")
    role = json.loads(kv).get("kv_role", "") if kv else ""
    return {"kv_producer": "prefill", "kv_consumer": "decode"}.get(role, "mixed")


def _int(flags: dict, name: str, default: int) -> int:
    value = flags.get(name)
    try:
        return int(value) if value is not None else default
    except ValueError:
        why = "a shell variable the script does not set" if "$" in value else "not a whole number"
        raise NpusimError(f"{name} {value}: {why}; the deployment needs its value") from None


# ------------------------------------------------------------------------------------------------- SGLang

def SGLANG(heads, acceptance, unknown, unmodelled) -> Deployment:  # noqa: N802 (a table entry)
    """SGLang servers as plan roles: TP is the server's world, attention DP / CP inside it, EP over it (DeepEP
    runs EP over every rank), the dense MLP over 1 rank or all, the LM head over the attention-TP group under
    --enable-dp-lm-head, the embedding replicated under attention DP; o_proj over the attention-TP group."""
    roles, notes, tree = _by_role(heads), [], {}
    for role, servers in roles.items():
        f = servers[0].flags
        tp, pp = _int(f, "--tp-size", 1), _int(f, "--pp-size", 1)
        dp = _int(f, "--attn-dp-size", 1)
        replicas = 1
        if "--dp-size" in f:
            if "--enable-dp-attention" in f:
                dp = _int(f, "--dp-size", 1)
            else:
                replicas = _int(f, "--dp-size", 1)  # data-parallel replicas: one instance each
        cp = _int(f, "--attn-cp-size", 1)
        attn_tp = tp // (dp * cp)
        ep = _int(f, "--ep-size", tp if f.get("--moe-a2a-backend") not in (None, "none") else 1)
        inst = {"ranks": tp * pp, "attention": _attention(dp, attn_tp, cp),
                "moe": {"ep": ep, "tp": tp // ep} if ep < tp else {"ep": ep},
                "dense_tp": 1 if f.get("--moe-dense-tp-size") == "1" else tp,
                "lm_head_tp": attn_tp if "--enable-dp-lm-head" in f else tp,
                "embed_tp": 1 if dp > 1 else tp, "o_proj_tp": attn_tp}
        if pp > 1:
            inst["pp"] = pp
        if f.get("--deepep-mode") in ("normal", "auto"):
            inst["moe"]["fused_dispatch_tokens"] = 0  # DeepEP's bulk dispatch for every prefill batch
        streams = {}
        if "--disable-cuda-graph" in f or f.get("--cuda-graph-backend-decode") == "disabled":
            streams["graph_mode"] = False
        if "--enable-two-batch-overlap" in f:
            streams["two_microbatch"] = True
        if streams:
            inst["streams"] = streams
        count = sum(s.copies for s in servers) * replicas // max(1, _nodes_per_server(f, servers))
        if count > 1:
            inst["instances"] = count
        tree[role] = inst
    lead = roles.get("decode", roles.get("mixed", roles.get("prefill")))[0].flags
    _mtp(tree, _int(lead, "--speculative-num-steps", 0), acceptance, notes)
    if lead.get("--speculative-algorithm") == "EAGLE3":
        notes.append(EAGLE3)
    chunk = _int(lead, "--chunked-prefill-size", -1)
    if chunk > 0:
        tree["prefill_chunk"] = chunk
    redundant = _int(lead, "--ep-num-redundant-experts", 0)
    if redundant:
        tree["eplb"] = {"redundant_experts": redundant}
    _shape(tree)
    dec = roles.get("decode", roles.get("mixed"))
    batch = _int(dec[0].flags, "--max-running-requests", 0) * tree.get("decode", {}).get("instances", 1) if dec \
        else 0
    quant = "w8a8" if lead.get("--quantization") == "modelslim" else "bf16"
    if quant == "w8a8":
        notes.append("--quantization modelslim: a W8A8 or W4A8 checkpoint (the flags do not say which); read as w8a8")
    return Deployment("sglang", tree, quant, batch, _int(lead, "--context-length", 0), unknown, unmodelled,
                      tuple(notes))


def _nodes_per_server(flags: dict, servers: list[Server]) -> int:
    """Commands one server spans: a command run once per node of a multi-node server (a loop over its addresses)
    counts once; the script's own `--node-rank "$NODE_RANK"` command is one server already."""
    nnodes = _int(flags, "--nnodes", 1) if (flags.get("--nnodes") or "1").isdigit() else 1
    return nnodes if servers[0].copies >= nnodes > 1 else 1


# ------------------------------------------------------------------------------------------------- vLLM

def VLLM(heads, acceptance, unknown, unmodelled) -> Deployment:  # noqa: N802 (a table entry)
    """vLLM-Ascend servers as plan roles: DP engines of TP ranks (DSA-CP: the TP group splits the sequence),
    EP over every rank with --enable-expert-parallel, finegrained_tp_config's o_proj / MLP / embedding / LM head
    sizes (each else TP)."""
    roles, notes, tree = _by_role(heads), [], {}
    c8 = set()
    for role, servers in roles.items():
        f = servers[0].flags
        tp, dp, pp = (_int(f, n, 1) for n in ("--tensor-parallel-size", "--data-parallel-size",
                                               "--pipeline-parallel-size"))
        extra = json.loads(f.get("--additional-config") or "{}")
        fine = extra.get("finegrained_tp_config", {})
        n = dp * tp
        cp = tp if extra.get("enable_dsa_cp") and role == "prefill" else 1
        inst = {"ranks": n * pp, "attention": _attention(dp, tp // cp, cp),
                "moe": {"ep": n} if "--enable-expert-parallel" in f else {"ep": 1, "tp": n},
                "o_proj_tp": fine.get("oproj_tensor_parallel_size", tp // cp),  # DSA-CP: unsplit
                "dense_tp": fine.get("mlp_tensor_parallel_size", tp),
                "embed_tp": fine.get("embedding_tensor_parallel_size", tp),
                "lm_head_tp": fine.get("lmhead_tensor_parallel_size", tp)}
        if pp > 1:
            inst["pp"] = pp
        streams = {}
        if "--enforce-eager" in f:
            streams["graph_mode"] = False
        if extra.get("multistream_overlap_shared_expert"):
            streams["shared_expert_side_stream"] = True
        if streams:
            inst["streams"] = streams
        count = sum(s.copies for s in servers)
        if count > 1:
            inst["instances"] = count
        c8.add(bool(extra.get("enable_sparse_sfa_c8") or extra.get("enable_sparse_li_c8")))
        tree[role] = inst
    if len(c8) > 1:
        notes.append("the roles hold different cache formats (C8 on some, BF16 on others): the KV blocks the prefill "
                     "sends do not match the decode's; read as C8")
    lead = roles.get("decode", roles.get("mixed", roles.get("prefill")))[0].flags
    spec = json.loads(lead.get("--speculative-config") or "{}")
    _mtp(tree, int(spec.get("num_speculative_tokens", 0)), acceptance, notes)
    if spec.get("method") == "eagle3":
        notes.append(EAGLE3)
    eplb = json.loads(lead.get("--eplb-config") or "{}")
    if eplb.get("num_redundant_experts"):
        tree["eplb"] = {"redundant_experts": int(eplb["num_redundant_experts"])}
    _shape(tree)
    dec = roles.get("decode", roles.get("mixed"))
    batch = 0
    if dec:
        f = dec[0].flags
        batch = _int(f, "--max-num-seqs", 0) * _int(f, "--data-parallel-size", 1) * tree[
            "decode"].get("instances", 1)
    quant = "bf16"
    if lead.get("--quantization") == "ascend":
        quant = "w8a8c8" if True in c8 else "w8a8"
        notes.append(f"--quantization ascend: an msModelSlim W8A8 or W4A8 checkpoint; read as {quant}")
    return Deployment("vllm-ascend", tree, quant, batch, _int(lead, "--max-model-len", 0), unknown, unmodelled,
                      tuple(notes))


# ----------------------------------------------------------------------------------------------- the plan

def _by_role(heads: list[Server]) -> dict[str, list[Server]]:
    out: dict[str, list[Server]] = {}
    for s in heads:
        out.setdefault(s.role, []).append(s)
    return out


def _attention(dp: int, tp: int, cp: int) -> dict:
    return {k: v for k, v in (("dp", dp), ("tp", tp), ("cp", cp)) if v > 1} or {"tp": 1}


def _mtp(tree: dict, depth: int, acceptance: dict[int, float], notes: list) -> None:
    if not depth:
        return
    if depth not in acceptance:
        notes.append(f"MTP depth {depth} has no published acceptance; set plan.mtp.acceptance")
    tree["mtp"] = {"depth": depth, "acceptance": acceptance.get(depth, 0.0)}


def _shape(tree: dict) -> None:
    """A single mixed role is the co-located plan's decode instance."""
    if "mixed" in tree:
        tree["decode"] = tree.pop("mixed")
        tree["colocated"] = True
