"""Launch commands of a deployment for a serving framework (vLLM-Ascend, SGLang on Ascend), from its plan.

A plan's instance roles become server commands: one per role of a disaggregated plan (prefill, decode; each copy of
a role its own server), one for a co-located plan. The degrees map onto each framework's documented flags
(`workloads/frameworks/*.yaml`, which cite the documentation and its commit), and every flag, value and environment
variable written is checked against the flag set of the release the table names (SGLang 0.5.23, vLLM 0.23.0 with
vLLM-Ascend 0.23.0.post1, extracted from the packages by scripts/framework_flags.py). What a framework has no flag
for — an o_proj split SGLang does not have, prefill context parallelism on a model vLLM-Ascend cannot split — is not
approximated: it is listed in the output as not expressible, and the command runs the framework's own default for
it. Where the difference would change what npusim sized (a cache format the framework cannot store: C8 caches in
SGLang), nothing is emitted and the script says why in one sentence.

Limits: the commands carry what the plan decides (parallelism, MTP, graph mode, EPLB replicas, quantisation and
cache format), the serving limits given (running requests, token budget, context length) and the environment of the
frameworks' Ascend deployments (the tables' `env`); memory fractions, graph batch sizes and addresses are left to
the operator, addresses as shell variables.
"""

from __future__ import annotations

import json
import math
import shlex
from dataclasses import dataclass, field

from npusim.errors import NpusimError
from npusim.spec.framework import Framework, load_framework
from npusim.spec.model import ModelConfig
from npusim.spec.plan import Instance, Plan
from npusim.spec.quant import QuantScheme
from npusim.spec.system import System

Args = list[tuple[str, str | None]]

SGLANG_PORTS = {"prefill": 8000, "decode": 8001, "mixed": 8000}
SGLANG_BOOTSTRAP = 8998  # SGLang's default bootstrap port; copy i of the prefill role takes 8998 + i
VLLM_PORTS = {"prefill": 9000, "decode": 9100, "mixed": 9000}
VLLM_KV_PORTS = {"prefill": "30000", "decode": "30100"}  # the 1P1D tutorial's Mooncake ports
DP_RPC_PORT = 12890
MASTER_PORT = 29500
DIST_PORT = 5000


@dataclass(frozen=True)
class Limits:
    """Serving limits the commands carry: lengths, running requests per attention-DP rank of the decode role, prompts
    per prefill step, and the prefill token budget of a step."""

    input: int
    output: int
    max_batch: int
    prefill_requests: int = 1
    token_budget: int = 0  # 0 = one prefill step of prefill_requests prompts

    @property
    def context_length(self) -> int:
        return self.input + self.output

    @property
    def prefill_tokens(self) -> int:
        return self.token_budget or self.prefill_requests * self.input


def limits_for(plan: Plan, *, input: int, output: int, batch: int, prefill_batch: int = 1) -> Limits:
    """The limits of a prediction's scenario: the global decode `batch` shared by the attention-DP ranks of every
    decode instance, and one prefill step of `prefill_batch` prompts (or of one chunk, with chunked prefill)."""
    dec = plan.instance("decode")
    per_rank = math.ceil(batch / (dec.attention.dp * dec.instances))
    budget = min(plan.prefill_chunk, prefill_batch * input) if plan.prefill_chunk else 0
    return Limits(input, output, per_rank, prefill_batch, budget)


@dataclass(frozen=True)
class Command:
    """One server launch: `nodes` nodes run it (NODE_RANK 0 .. nodes-1; `worker_args` apply on the others)."""

    role: str  # prefill | decode | mixed | router
    copy: int
    ranks: int
    nodes: int
    program: str
    args: tuple[tuple[str, str | None], ...]
    worker_args: tuple[tuple[str, str | None], ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def text(self, worker: bool = False) -> str:
        args = self.args + (self.worker_args if worker else ())
        parts = [f"{k}={v}" for k, v in self.env] + [self.program]
        parts += [f"{k} {_quote(v)}" if v is not None else k for k, v in args]
        return " \\\n    ".join(parts)


def _quote(value: str) -> str:
    """Shell-quote a value; one already written in double quotes (it holds $VARIABLES for the shell) stays as is."""
    if value.startswith('"'):
        return value
    return shlex.quote(value)


@dataclass(frozen=True)
class Launch:
    framework: Framework
    plan: str
    model: str
    system: str
    quant: str
    commands: tuple[Command, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)  # what the framework cannot express
    refused: str = ""  # why nothing is emitted: the framework would run something npusim did not size

    def script(self) -> str:
        f = self.framework
        lines = ["#!/bin/bash",
                 f"# {f.title} launch commands written by npusim for plan {self.plan}: {self.model} on {self.system}, "
                 f"{self.quant}.",
                 f"# Framework version: {f.version}."]
        if f.release:
            lines.append(f"# Flags, values and environment checked against {f.release.title} "
                         f"(workloads/frameworks/flags/{', '.join(f.release.files)}); documented by:")
        lines += [f"#   {d}" for d in f.docs]
        if self.refused:
            lines.append(f"# Not emitted: {self.refused}")
            lines += [f"# Nor expressible in {f.title}: {n}" for n in self.notes]
            return "\n".join(lines) + "\n"
        lines += ["# Set MODEL_PATH (a checkpoint in the quantisation above), DRAFT_MODEL_PATH (an EAGLE-3 plan's "
                  "draft checkpoint) and the node addresses (PREFILL0_IP, ...);",
                  "# run each block on its nodes with NODE_RANK set (0 = the head node of that server)."]
        if self.notes:
            lines.append(f"# Not expressible in {f.title} (the server runs its own default instead):")
            lines += [f"#   - {n}" for n in self.notes]
        else:
            lines.append(f"# Everything the plan decides is expressed in {f.title}'s flags.")
        for c in self.commands:
            lines.append("")
            where = f"{c.nodes} node{'s' if c.nodes > 1 else ''}" if c.ranks else "any host"
            what = "router" if c.role == "router" else f"{c.role} server {c.copy}: {c.ranks} ranks"
            lines.append(f"# {what} on {where}" + (" (NODE_RANK 0; the others below)" if c.worker_args else ""))
            lines.append(c.text())
            if c.worker_args:
                lines.append(f"# {what}: nodes with NODE_RANK 1..{c.nodes - 1}")
                lines.append(c.text(worker=True))
        return "\n".join(lines) + "\n"

    def as_dict(self) -> dict:
        return {"framework": self.framework.name, "version": self.framework.version, "docs": list(self.framework.docs),
                "release": self.framework.release.title if self.framework.release else "",
                "plan": self.plan, "not_expressible": list(self.notes), "refused": self.refused,
                "commands": [{"role": c.role, "copy": c.copy, "ranks": c.ranks, "nodes": c.nodes, "program": c.program,
                              "args": [[k, v] for k, v in c.args], "worker_args": [[k, v] for k, v in c.worker_args],
                              "env": dict(c.env)} for c in self.commands]}


def _json(tree: dict) -> str:
    return json.dumps(tree, separators=(", ", ": "))


@dataclass
class _Context:
    plan: Plan
    model: ModelConfig
    quant: QuantScheme
    system: System
    limits: Limits
    notes: list[str] = field(default_factory=list)
    shapes: dict[str, tuple[int, int]] = field(default_factory=dict)  # role -> (DP, TP) as emitted
    split: dict[str, int] = field(default_factory=dict)  # role -> servers one instance runs as (vLLM DSA-CP)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    @property
    def c8(self) -> bool:
        """The plan's caches are INT8 (Ascend C8: latent KV and indexer), as npusim sized and timed them."""
        return self.quant.kv_cache.dtype == "int8" or self.quant.indexer_cache.dtype == "int8"

    def roles(self) -> list[tuple[str, Instance]]:
        """Server roles: prefill and decode (disaggregated), one mixed server (co-located), or the decode servers of
        a decode-only plan (the decode pool of a disaggregated service whose prefill pool the plan leaves out)."""
        if self.plan.disaggregated:
            return [("prefill", self.plan.prefill), ("decode", self.plan.decode)]
        if self.plan.runs_prefill:
            return [("mixed", self.plan.instance("decode"))]
        self.note("the plan is decode-only: these are the decode servers of a disaggregated service, whose prefill "
                  "servers (and router or proxy) the plan does not describe")
        return [("decode", self.plan.decode)]

    def streams(self, role: str):
        """The streams of the phase a role's server runs (decode for a mixed server)."""
        return self.plan.streams_of("prefill" if role == "prefill" else "decode")

    def nodes(self, inst: Instance) -> int:
        return math.ceil(inst.ranks / self.system.ranks_per_node)

    def drafts(self, role: str) -> int:
        """MTP draft tokens the role's server runs: the plan's depth, one on a prefill server (it only produces the
        first draft for the decode server, as both frameworks' PD examples run it)."""
        depth = self.plan.mtp.depth
        return min(depth, 1) if role == "prefill" else depth

    def env(self, fw: Framework, role: str, extra: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
        """The environment of the role's server: the framework's published Ascend environment (all roles, then the
        role's own), then what the plan sets; each name checked against the release and the runtime."""
        table = fw.env or {}
        env = {**table.get("all", {}), **table.get(role, {}), **(extra or {})}
        for name in env:
            problem = fw.env_problem(name)
            if problem:
                raise NpusimError(problem, file=fw.name)
        return tuple(env.items())


class Refused(Exception):
    """The framework cannot run the plan as npusim sized it; the message says what differs."""


# ------------------------------------------------------------------------------------------------------ SGLang

def _sglang_role(ctx: _Context, role: str, inst: Instance) -> Args:
    a, n, cfg, pl = inst.attention, inst.stage_ranks, ctx.model, ctx.plan
    args: Args = [("--trust-remote-code", None), ("--attention-backend", "ascend"), ("--device", "npu"),
                  ("--tp-size", str(n))]
    if inst.pp > 1:
        args.append(("--pp-size", str(inst.pp)))
    if a.dp > 1:
        args.append(("--attn-dp-size", str(a.dp)))
    if a.cp > 1:
        if role == "decode" or not cfg.has_indexer or cfg.is_v4:
            ctx.note(f"{role}.attention.cp {a.cp}: SGLang's attention context parallelism is the DeepSeek V3.2 "
                     "(DSA) prefill's; this role runs without it")
        else:  # zigzag: the former in-seq-split, the split B's V3.2 deployment runs
            args += [("--attn-cp-size", str(a.cp)), ("--enable-prefill-cp", None), ("--cp-strategy", "zigzag")]
    attn_tp = a.tp
    if inst.o_proj_group != attn_tp:
        ctx.note(f"{role}.o_proj_tp {inst.o_proj_tp}: SGLang splits o_proj over the attention TP group "
                 f"({attn_tp}); no flag splits it further")
    ep = inst.moe.ep
    if ep > 1:
        args.append(("--ep-size", str(ep)))
    if ep == n and n > 1:
        mode = {"decode": "low_latency", "mixed": "auto"}.get(role, "normal")
        if role == "prefill" and inst.moe.fused_dispatch_tokens:
            ctx.note(f"{role}.moe.fused_dispatch_tokens {inst.moe.fused_dispatch_tokens}: SGLang's DeepEP uses the "
                     "normal (bulk) dispatch for every prefill batch, with no token threshold")
        args += [("--moe-a2a-backend", "deepep"), ("--deepep-mode", mode)]
    if cfg.first_k_dense_replace:
        if inst.dense_tp == 1 and n > 1:
            args.append(("--moe-dense-tp-size", "1"))
        elif inst.dense_tp != n:
            ctx.note(f"{role}.dense_tp {inst.dense_tp}: SGLang runs the dense MLP layers over 1 rank "
                     f"(--moe-dense-tp-size 1) or the whole TP group ({n})")
    if a.dp > 1 and inst.lm_head_tp == attn_tp:
        args.append(("--enable-dp-lm-head", None))
    elif inst.lm_head_tp != n:
        ctx.note(f"{role}.lm_head_tp {inst.lm_head_tp}: SGLang splits the LM head over the attention TP group "
                 f"({attn_tp}, --enable-dp-lm-head) or the whole TP group ({n})")
    embed = 1 if a.dp > 1 else n
    if inst.embed_tp != embed:
        ctx.note(f"{role}.embed_tp {inst.embed_tp}: SGLang's embedding is "
                 + ("replicated under DP attention" if a.dp > 1 else f"split over the TP group ({n})"))
    if inst.microbatches == 2 or ctx.streams(role).two_microbatch:
        args.append(("--enable-two-batch-overlap", None))
    drafts = ctx.drafts(role)
    if drafts and pl.mtp.draft:  # an EAGLE-3 draft model, its checkpoint where the operator puts it
        args += [("--speculative-algorithm", "EAGLE3"), ("--speculative-draft-model-path", '"$DRAFT_MODEL_PATH"')]
    elif drafts:
        args.append(("--speculative-algorithm", "NEXTN"))
    if drafts:
        args += [("--speculative-num-steps", str(drafts)), ("--speculative-eagle-topk", "1"),
                 ("--speculative-num-draft-tokens", str(drafts + 1))]
    if not ctx.streams(role).graph_mode:
        args += [("--cuda-graph-backend-decode", "disabled"), ("--cuda-graph-backend-prefill", "disabled")]
    lim = ctx.limits
    running = lim.prefill_requests if role == "prefill" else lim.max_batch * a.dp
    args += [("--max-running-requests", str(running)), ("--max-prefill-tokens", str(lim.prefill_tokens)),
             ("--chunked-prefill-size", str(pl.prefill_chunk or -1)), ("--context-length", str(lim.context_length)),
             ("--disable-radix-cache", None)]
    if pl.eplb.redundant_experts:
        args.append(("--ep-num-redundant-experts", str(pl.eplb.redundant_experts)))
    return args


def _sglang_env(ctx: _Context, role: str, inst: Instance, args: Args) -> dict[str, str]:
    """What the plan sets in SGLang's environment. DeepEP's low-latency dispatch buffer holds
    SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK tokens per rank: the tokens of one decode step of an attention-DP
    group (running requests x (1 + draft tokens)) over its attention-TP ranks, which scatter them. The Ascend
    best-practice deployments set exactly that (R1 decode DP32 832 requests, 3 tokens: 78; DP16 384, 4: 96; mixed
    DP16 256, 4: 64; mixed DP4 x TP4 144, 4: 36) or more (V3.2 DP8 x TP4 32, 4: 4, set 8). The bulk (normal)
    dispatch of an INT8 checkpoint's prefill quantises to INT8 (DEEP_NORMAL_MODE_USE_INT8_QUANT, as B sets it)."""
    flags, env = dict(args), {}
    if flags.get("--deepep-mode") in ("low_latency", "auto"):
        a = inst.attention
        tokens = ctx.limits.max_batch * (1 + ctx.drafts(role))
        env["SGLANG_DEEPEP_NUM_MAX_DISPATCH_TOKENS_PER_RANK"] = str(math.ceil(tokens / (a.tp * a.cp)))
    if role in ("prefill", "mixed") and "--deepep-mode" in flags and ctx.quant.routed_experts.dtype == "int8":
        env["DEEP_NORMAL_MODE_USE_INT8_QUANT"] = "1"
    return env


def _sglang(ctx: _Context, fw: Framework) -> list[Command]:
    pl, out = ctx.plan, []
    common = _quant_sglang(ctx)
    for role, inst in ctx.roles():
        base = _sglang_role(ctx, role, inst) + common
        env = ctx.env(fw, role, _sglang_env(ctx, role, inst, base))
        nodes = ctx.nodes(inst)
        for i in range(inst.instances):
            host = f"${role.upper()}{i}_IP"
            args = base + [("--host", f'"{host}"'), ("--port", str(SGLANG_PORTS[role]))]
            if role != "mixed":
                args += [("--disaggregation-mode", role), ("--disaggregation-transfer-backend", "ascend")]
            if role == "prefill":
                args.append(("--disaggregation-bootstrap-port", str(SGLANG_BOOTSTRAP + i)))
            if nodes > 1:
                args += [("--nnodes", str(nodes)), ("--node-rank", '"$NODE_RANK"'),
                         ("--dist-init-addr", f'"{host}:{DIST_PORT}"')]
            elif inst.ranks < ctx.system.ranks_per_node and (i * inst.ranks) % ctx.system.ranks_per_node:
                args.append(("--base-gpu-id", str((i * inst.ranks) % ctx.system.ranks_per_node)))
            fw.check(args)
            out.append(Command(role, i, inst.ranks, nodes, fw.launcher, tuple(args), env=env))
    if pl.disaggregated:
        args: Args = [("--pd-disaggregation", None)]
        args += [("--prefill", f'"http://$PREFILL{i}_IP:{SGLANG_PORTS["prefill"]}" {SGLANG_BOOTSTRAP + i}')
                 for i in range(pl.prefill.instances)]
        args += [("--decode", f'"http://$DECODE{i}_IP:{SGLANG_PORTS["decode"]}"') for i in range(pl.decode.instances)]
        args += [("--host", "127.0.0.1"), ("--port", "6688"), ("--mini-lb", None)]
        fw.check(args, router=True)
        out.append(Command("router", 0, 0, 1, fw.router, tuple(args)))
    return out


def _quant_sglang(ctx: _Context) -> Args:
    q = ctx.quant.name
    if ctx.c8:
        raise Refused(f"quant {q} holds the KV and indexer caches in INT8 (C8), which SGLang 0.5.23 cannot store on "
                      "Ascend (--kv-cache-dtype takes auto, BF16, FP8 and FP4 formats only), so its servers would hold "
                      "BF16 caches twice as large as npusim sized; plan with --quant w8a8 (or w4a8) for SGLang")
    if q == "bf16":
        return [("--dtype", "bfloat16")]
    if q in ("w8a8", "w8a8-modelslim", "w4a8"):
        return [("--quantization", "modelslim"), ("--dtype", "bfloat16")]
    ctx.note(f"quant {q}: SGLang documents no {q} checkpoint on Ascend (modelslim W8A8 / W4A8 only)")
    return []


# ------------------------------------------------------------------------------------------------- vLLM-Ascend

def _vllm_role(ctx: _Context, role: str, inst: Instance) -> tuple[Args, dict]:
    a, cfg, pl = inst.attention, ctx.model, ctx.plan
    extra: dict = {}
    tp, dp = a.tp, a.dp
    if a.cp > 1:
        if role == "decode":
            ctx.note(f"{role}.attention.cp {a.cp}: vLLM-Ascend's decode context parallelism (DCP) shards the KV "
                     "inside the TP group, not the plan's split; run as TP")
            tp *= a.cp
        elif cfg.has_indexer and a.tp == 1:
            tp = _dsa_cp_group(cfg.num_attention_heads, a.cp)  # DSA-CP: the sequence is split over the TP group
            extra["enable_dsa_cp"] = True
            if tp != a.cp:
                ctx.split[role] = a.cp // tp
                ctx.note(f"{role}.attention.cp {a.cp}: vLLM's TP group, which DSA-CP splits the sequence over, must "
                         f"divide the {cfg.num_attention_heads} attention heads; each {inst.ranks}-rank {role} "
                         f"instance runs as {a.cp // tp} servers of DSA-CP {tp}, so a prompt is split over {tp} "
                         f"ranks, not {a.cp}, and its prefill takes longer than npusim predicted")
                if inst.moe.ep == inst.stage_ranks:
                    ctx.note(f"{role}.moe.ep {inst.moe.ep}: split into those servers, each runs its experts over "
                             f"its own {tp} ranks (EP {tp})")
        else:
            ctx.note(f"{role}.attention.cp {a.cp}: vLLM-Ascend supports no prefill context parallelism here "
                     "(DSA-CP needs a DSA model with attention TP 1); run as TP")
            tp *= a.cp
    args: Args = [("--trust-remote-code", None), ("--tensor-parallel-size", str(tp))]
    if dp > 1:
        args.append(("--data-parallel-size", str(dp)))
    if inst.pp > 1:
        args.append(("--pipeline-parallel-size", str(inst.pp)))
    n = inst.stage_ranks
    if inst.moe.ep == n and n > 1:
        args.append(("--enable-expert-parallel", None))
    elif inst.moe.ep > 1:
        ctx.note(f"{role}.moe.ep {inst.moe.ep}: vLLM-Ascend's MoE is EP over all {n} ranks "
                 "(--enable-expert-parallel) or TP over them")
    if role == "prefill" and inst.moe.fused_dispatch_tokens == 0:
        ctx.note(f"{role}.moe.fused_dispatch_tokens 0: vLLM-Ascend picks MC2 below its mc2 token capacity; no flag "
                 "forces the bulk all-to-all")
    grained = {}
    decode_node = role == "decode" and ctx.streams(role).graph_mode
    # Under DSA-CP a P node runs o_proj (and q_b / kv_b) unsplit on its own tokens: vllm_ascend/ops/linear_op.py's
    # ShardedCPRowParallelOp has a one-rank comm group (layer_sharding spreads the weights, not the matmul).
    native = {"o_proj_tp": 1 if extra.get("enable_dsa_cp") and role == "prefill" else tp}
    for name, key, value in (("o_proj_tp", "oproj_tensor_parallel_size", inst.o_proj_group),
                             ("dense_tp", "mlp_tensor_parallel_size", inst.dense_tp),
                             ("embed_tp", "embedding_tensor_parallel_size", inst.embed_tp),
                             ("lm_head_tp", "lmhead_tensor_parallel_size", inst.lm_head_tp)):
        if value == native.get(name, tp):
            continue
        ok = tp == 1 and dp % value == 0 and (name != "o_proj_tp" or decode_node)
        if ok:
            grained[key] = value
        else:
            why = ("needs TP 1, graph mode and a PD decode node" if name == "o_proj_tp"
                   else "needs TP 1 and a size dividing the DP ranks")
            ctx.note(f"{role}.{name} {value}: vLLM-Ascend's finegrained_tp_config.{key} {why}; it "
                     + (f"follows TP ({tp})" if native.get(name, tp) == tp else "runs unsplit under DSA-CP"))
    if grained:
        extra["finegrained_tp_config"] = grained
    if ctx.streams(role).shared_expert_side_stream:
        extra["multistream_overlap_shared_expert"] = True
    if inst.microbatches == 2 or ctx.streams(role).two_microbatch:
        ctx.note("two-microbatch overlap: vLLM-Ascend documents no switch for it")
    q = ctx.quant.name
    if ctx.c8:
        if not cfg.has_indexer:
            raise Refused(f"quant {q} holds the KV cache in INT8 (C8); vLLM-Ascend 0.23.0.post1 reads C8 caches only "
                          "for sparse-attention (DSA) models (enable_sparse_sfa_c8 / enable_sparse_li_c8), so "
                          f"{cfg.name}'s servers would hold BF16 caches twice as large as npusim sized")
        extra.update(enable_sparse_sfa_c8=True, enable_sparse_li_c8=True)  # the same cache format on every role
    drafts = ctx.drafts(role)
    if drafts:
        if pl.mtp.draft:  # in double quotes, for the shell to put the draft checkpoint's path in
            value = _json({"num_speculative_tokens": drafts, "method": "eagle3", "model": "$DRAFT_MODEL_PATH"})
            args.append(("--speculative-config", '"' + value.replace('"', '\\"') + '"'))
        else:
            args.append(("--speculative-config", _json({"num_speculative_tokens": drafts, "method": "deepseek_mtp"})))
    if role == "prefill" or not ctx.streams(role).graph_mode:
        if ctx.streams(role).graph_mode:
            ctx.note(f"{role}.streams.graph_mode: vLLM-Ascend captures graphs for decode only (FULL_DECODE_ONLY, as "
                     "its PD tutorial runs the P node eagerly); the prefill runs eager, each kernel launched")
        args.append(("--enforce-eager", None))
    else:
        args.append(("--compilation-config", _json({"cudagraph_mode": "FULL_DECODE_ONLY"})))
    lim = ctx.limits
    if role == "prefill":
        seqs, tokens = max(1, math.ceil(lim.prefill_requests / dp)), lim.prefill_tokens
    else:
        seqs = lim.max_batch
        tokens = lim.max_batch * (1 + drafts) if role == "decode" else max(lim.prefill_tokens, lim.max_batch)
    args += [("--max-num-seqs", str(seqs)), ("--max-num-batched-tokens", str(tokens)),
             ("--max-model-len", str(lim.context_length))]
    ctx.shapes[role] = (dp, tp)
    if q in ("w8a8", "w8a8-modelslim", "w4a8", "w8a8c8", "w4a8c8"):
        args.append(("--quantization", "ascend"))
    elif q != "bf16":
        ctx.note(f"quant {q}: vLLM-Ascend documents no {q} checkpoint (msModelSlim W8A8 / W4A8: --quantization ascend)")
    args.append(("--no-enable-prefix-caching", None))  # as T's commands run: the plan models no prefix reuse
    if pl.eplb.redundant_experts:
        args += [("--enable-eplb", None),
                 ("--eplb-config", _json({"num_redundant_experts": pl.eplb.redundant_experts, "use_async": False}))]
    return args, extra


def _vllm(ctx: _Context, fw: Framework) -> list[Command]:
    pl, out = ctx.plan, []
    per_node = ctx.system.ranks_per_node
    roles = [(role, inst, *_vllm_role(ctx, role, inst)) for role, inst in ctx.roles()]
    for role, inst, args, extra in roles:
        if role in ("prefill", "decode"):
            shape = {r: {"dp_size": dp, "tp_size": tp} for r, (dp, tp) in ctx.shapes.items()}
            args.append(("--kv-transfer-config", _json({
                "kv_connector": "MooncakeConnectorV1", "kv_role": "kv_producer" if role == "prefill" else "kv_consumer",
                "kv_port": VLLM_KV_PORTS[role], "kv_connector_extra_config": shape})))
        if extra:
            args.append(("--additional-config", _json(extra)))
        dp, engine = ctx.shapes[role]
        engine_ranks = engine * inst.pp
        split = ctx.split.get(role, 1)
        ranks = inst.ranks // split
        nodes = math.ceil(ranks / per_node)
        for i in range(inst.instances * split):
            host = f"${role.upper()}{i}_IP"
            head: Args = args + [("--host", f'"{host}"'), ("--port", str(VLLM_PORTS[role]))]
            workers: Args = []
            if nodes > 1 and engine_ranks <= per_node:
                local = per_node // engine_ranks
                head += [("--data-parallel-size-local", str(local)),
                         ("--data-parallel-start-rank", f'"$((NODE_RANK * {local}))"'),
                         ("--data-parallel-address", f'"{host}"'), ("--data-parallel-rpc-port", str(DP_RPC_PORT))]
                workers = [("--headless", None)]
            elif nodes > 1 and dp == 1:
                head += [("--distributed-executor-backend", "mp"), ("--nnodes", str(nodes)),
                         ("--node-rank", '"$NODE_RANK"'), ("--master-addr", f'"{host}"'),
                         ("--master-port", str(MASTER_PORT))]
                workers = [("--headless", None)]
            elif nodes > 1:
                ctx.note(f"{role}: {dp} DP engines of {engine_ranks} ranks each span nodes; vLLM-Ascend's "
                         "multi-node DP keeps an engine inside a node (Ray is its route for this)")
            fw.check(head + workers)
            devices = {}
            if ranks < per_node and inst.instances * split > 1:
                first = (i * ranks) % per_node
                devices = {"ASCEND_RT_VISIBLE_DEVICES": ",".join(str(first + k) for k in range(ranks))}
            env = ctx.env(fw, role, devices)
            out.append(Command(role, i, ranks, nodes, fw.launcher, tuple(head), tuple(workers), env))
    if pl.disaggregated:
        ctx.note("PD proxy: run vLLM-Ascend's examples/disaggregated_prefill_v1/load_balance_proxy_server_example.py "
                 "with the prefill and decode hosts and ports above (it has no documented fixed flags)")
    return out


EMITTERS = {"sglang": _sglang, "vllm-ascend": _vllm}


def launch(framework: str, plan: Plan, model: ModelConfig, quant: QuantScheme, system: System,
           limits: Limits) -> Launch:
    """The launch commands of `plan` in `framework` (a name of workloads/frameworks), with what it cannot express."""
    fw = load_framework(framework)
    ctx = _Context(plan, model, quant, system, limits)
    for role, inst in (("prefill", plan.prefill), ("decode", plan.decode)):
        if inst is not None and inst.ffn_ranks:
            ctx.note(f"{role}.ffn_ranks {inst.ffn_ranks}: {fw.title} has no attention-FFN disaggregation (experts on "
                     f"dies of their own); the command runs attention and experts co-located on the {inst.ranks} "
                     "attention ranks")
    try:
        commands = EMITTERS[fw.name](ctx, fw)
    except Refused as why:
        return Launch(fw, plan.name, model.name, system.name, quant.name, (), tuple(ctx.notes), str(why))
    return Launch(fw, plan.name, model.name, system.name, quant.name, tuple(commands), tuple(ctx.notes))


def _dsa_cp_group(heads: int, cp: int) -> int:
    """The largest DSA-CP group vLLM can run inside a split of `cp` ranks: a TP size dividing both the attention
    heads (vLLM's ModelConfig refuses any other) and `cp` (the rest become DP engines)."""
    return max(g for g in range(1, cp + 1) if heads % g == 0 and cp % g == 0)
