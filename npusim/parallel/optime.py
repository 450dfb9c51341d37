"""Time of one op on one rank: its kernel's tile trace simulated by the engine, or — for an op kind that has no
tiling yet — its roofline at the chip's calibrated efficiencies. Each result says which model produced it.

Each op's tiling is the fastest of its kernel's candidates as the engine times them (npusim.engine.tune), so more
resource never picks a slower tiling. Ops map onto kernels by kind: linears and absorption BMMs onto the GEMM tiling with the dtype scheme of their
weights; routed experts onto the grouped GEMM; the Lightning Indexer and the attention kernels onto their tilings
with the op's query-key pairs; norms onto the row-wise vector kernel; every other op kind onto the kernel of the
same name (KERNEL_OF lists the exceptions).

How the step runs an op (`OpRun`) acts on the mechanism it names: the plan's kernel options become the kernel's
tiling; a buffering depth is the depth of the kernel's double-buffered queues (npusim.kernels.program); a core
partition simulates the kernel on that many cores, drawing on the chip's HBM and L2 at their DMA rates (the step
shares those servers between partitions running side by side); a fused group's intermediates are
read from / written to L2 instead of HBM.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from npusim.engine.result import launch_cost
from npusim.engine.tune import tuned
from npusim.graph.ops import Op
from npusim.errors import NpusimError, did_you_mean
from npusim.kernels.base import KERNELS, Kernel
from npusim.kernels.catalog import kernel
from npusim.kernels.rowwise import ROW_OPS as ROWWISE_OPS
from npusim.kernels.trace import Instr, Loop, Node, Program, Trace
from npusim.spec.chip import Chip
from npusim.spec.plan import KernelOptions
from npusim.spec.reads import ReadsMemo

GEMM_SCHEMES = {"bf16": "bf16", "fp16": "fp16", "int8": "int8", "int4": "int8", "fp8": "fp8", "mxfp8": "mxfp8",
                "mxfp4": "mxfp4"}  # int4 weights run the int8 cube path (Ascend W4A8 unpacks to int8)
KERNEL_OF = {"rmsnorm": "rowwise", "layernorm": "rowwise", "head_rmsnorm": "rowwise", "hadamard": "gemm",
             "quant": "quantise"}


def kernel_name(op: Op) -> str:
    """The kernel an op runs (the name a plan's `kernels:` options are given under). A W8A8 linear (int8
    activations with per-token scales, int8 weights with per-channel scales) runs the MIX quant matmul whose AIVs
    dequantise (CANN QuantBatchMatmulV3's per-token template and catlass 12_quant_matmul alike); with int32 out
    there is nothing to dequantise and it is the cube's plain GEMM, the accumulators written by FIXPIPE."""
    if op.kind == "gemm" and op.dtypes.get("a") == op.dtypes.get("b") == "int8" and op.shape.get("batch", 1) == 1 \
            and op.dtypes.get("out") != "int32":
        return "quant_matmul"
    return KERNEL_OF.get(op.kind, op.kind)


# op kinds whose kernel has the same name and takes the op's shape keys (moe_gate is timed with the sigmoid score;
# V4's sqrt-softplus differs by a few vector ops per expert score)
SAME_NAME = ("compressor", "mhc_pre", "mhc_post", "moe_gate", "swiglu", "dequant_swiglu_quant", "embedding",
             "moe_combine", "cache_update")


@dataclass(frozen=True)
class OpTime:
    op: str
    kind: str
    time: float  # launch included
    roofline: float
    bound: str
    model: str  # "engine" (simulated tile trace) | "roofline" (no tiling yet: roofline / calibrated efficiency)
    activity: "Activity | None" = None  # what the launch did, for the energy model
    aiv_cores: int = 0  # AIV cores its kernel runs programs on (what a comm kernel holding AIVs takes from)


@dataclass(frozen=True)
class Activity:
    """Work one launch did on one rank: the inputs of the activity-based energy model."""

    cube_flops: float = 0.0
    vector_flops: float = 0.0
    hbm_bytes: float = 0.0
    l2_bytes: float = 0.0
    core_bytes: float = 0.0  # moved inside the AI cores: L1->L0 (MTE1), L0C out (FIXPIPE), UB streaming (VECTOR)


@dataclass(frozen=True)
class OpRun:
    """How the step runs one op: launch mode, the plan's kernel options, the AIC of its core partition (0 = all)
    and, inside a fused group, whether its activation input and its output stay on chip."""

    launch: str = "graph"
    options: KernelOptions | None = None
    cores: int = 0
    input_on_chip: bool = False
    output_on_chip: bool = False


def _scheme(op: Op, chip: Chip) -> str:
    """The GEMM dtype scheme of the op's weights, or BF16 where the chip's cube has no such mode."""
    dt = GEMM_SCHEMES.get(op.dtypes.get("b", "bf16"), "bf16")
    return dt if dt in chip.aic.cube.flop_per_cycle else "bf16"


ATTENTION = ("sparse_flash_attention", "flash_attention", "v4_attention")


def _dtype(op: Op, key: str, chip: Chip) -> str:
    dt = op.dtypes.get(key, "bf16")
    return dt if dt in chip.aic.cube.flop_per_cycle else "bf16"


def kernel_for(op: Op, chip: Chip, options: KernelOptions | None = None) -> Kernel | None:
    """The tiling that implements `op` with the plan's tile options for its kernel, or None when the op's kind has no
    tiling yet.

    Attention-like ops carry their total query-key `pairs`; a decode op's `sequences` (the graph's, cut by the
    sharding with its tokens) become the kernel's batch: `tokens` split into per-sequence queries, each sequence's
    keys read by its own blocks.
    """
    k = _default_kernel(op, chip)
    tiling = options.tiling() if options else {}
    if k is None or not tiling:
        return k
    allowed = set(type(k).options)
    for key in tiling:
        if key not in allowed:
            raise NpusimError(f"kernel {k.name} has no option '{key}'{did_you_mean(key, allowed)}; its options: "
                              f"{', '.join(sorted(allowed - {'dtype', 'out_dtype', 'op', 'causal', 'scale', 'counts'}))}",
                              field=f"kernels.{k.name}.{key}")
    return dataclasses.replace(k, **tiling)


def _default_kernel(op: Op, chip: Chip) -> Kernel | None:
    s = op.shape
    batch = s.get("batch", 1)
    if kernel_name(op) == "quant_matmul":
        return kernel("quant_matmul", {"m": s["m"], "n": s["n"], "k": s["k"]})
    if op.kind == "gemm":
        return kernel("gemm", {"m": s["m"], "n": s["n"], "k": s["k"], "batch": batch}, dtype=_scheme(op, chip),
                      out_dtype=op.dtypes.get("out", "bf16"))
    if op.kind == "grouped_gemm":
        return kernel("grouped_gemm", {k: s[k] for k in ("rows", "k", "n", "experts")}, dtype=_scheme(op, chip),
                      out_dtype=op.dtypes["out"])
    seqs = s.get("sequences", 1)  # attention-type ops: the sequences whose keys the launch reads apart
    if op.kind == "lightning_indexer":
        per_seq = max(1, s["tokens"] // seqs)
        return kernel("lightning_indexer", {"tokens": per_seq, "keys": max(1, math.ceil(s["pairs"] / s["tokens"])),
                                            "heads": s["heads"], "dim": s["dim"], "topk": s["topk"], "batch": seqs},
                      causal=0, dtype=_dtype(op, "q", chip))
    if op.kind in ATTENTION:
        shape = {k: v for k, v in _accepted(op.kind, s).items() if k not in ("tokens", "batch")}
        shape |= {"tokens": max(1, s["tokens"] // seqs), "batch": seqs, "keys": max(s.get("keys", 1), 1)}
        opts = {"dtype": _attention_dtype(op, chip)} | ({} if op.kind == "v4_attention" else {"causal": 0})
        return kernel(op.kind, shape, **opts)
    if op.kind in ROWWISE_OPS:
        rows = s.get("tokens", s.get("rows", 1)) * s.get("heads", 1)
        return kernel("rowwise", {"rows": max(1, rows), "dim": s["width"]}, op=op.kind, residual=s.get("residual", 0))
    if op.kind == "hadamard":  # a 128 x 128 Hadamard matrix applied on the cube
        return kernel("gemm", {"m": s["m"], "n": s["n"], "k": s["k"]}, dtype="bf16")
    if op.kind == "quant":
        return kernel("quantise", {"rows": s["rows"], "elements": s["elements"]}, dtype=op.dtypes["cache"])
    if op.kind == "copy":
        return kernel("copy", _accepted("copy", s), dtype=op.dtypes["x"], out_dtype=op.dtypes["out"])
    if op.kind == "moe_gate":
        return kernel("moe_gate", _accepted("moe_gate", s), dtype=op.dtypes.get("a", "bf16"))
    if op.kind == "moe_permute":
        return kernel("moe_permute", _accepted("moe_permute", s), dtype=op.dtypes["x"], out_dtype=op.dtypes["out"])
    if op.kind == "rope":  # the indexer's RoPE pairs halves, MLA's interleaves (models.md §1.3, [DS32-fix])
        return kernel("rope", _accepted("rope", s), layout="half" if op.name.startswith("idx_") else "interleaved")
    if op.kind in SAME_NAME:
        return kernel(op.kind, _accepted(op.kind, s))
    return None


def _attention_dtype(op: Op, chip: Chip) -> str:
    """The cube dtype of an attention kernel: BF16, but the absorbed dense MLA over an INT8 latent cache runs
    full-quant (INT8 queries, the INT8 cache as K and V: the R1 C8 decode's npu_fused_infer_attention_score_v2 with
    query_quant_mode 3, cann-recipes-infer models/deepseek_r1/models/modeling_deepseek.py:1302-1320 @ fbc225d;
    ops-transformer incre_flash_attention's IfaMatmulFullQuant) where the chip's cube has INT8."""
    full_quant = op.kind == "flash_attention" and op.dtypes.get("kv") == "int8" and op.shape.get("kv_heads", 1) == 1
    return "int8" if full_quant and "int8" in chip.aic.cube.flop_per_cycle else "bf16"


def _accepted(name: str, shape: dict[str, int]) -> dict[str, int]:
    fields = {f.name for f in dataclasses.fields(KERNELS[name])}
    return {k: v for k, v in shape.items() if k in fields}


_memo: dict[str, OpTime] = {}
_by_op: dict[tuple, OpTime] = {}  # the same memo by the op's fields as they are, before any digest is taken


def op_time(op: Op, chip: Chip, run: OpRun | str = "graph") -> OpTime:
    """Memoised by content, in the process and on disk: identical ops (61 layers, sweep points, later runs) cost
    one simulation. The disk key includes a fingerprint of the kernel and engine code, so edits never reuse stale
    results. `run` is an OpRun or just a launch mode.

    In the process, an op whose fields, chip content and run were seen before is found by them as they are (a plan
    search asks for 57 000 op times, nearly all repeats): the digest of the disk key (a repr of the chip, its core
    partition's when the run has one) is only taken on a miss, and the value is the one that key holds."""
    run = OpRun(run) if isinstance(run, str) else run
    fields = (op.kind, op.unit, tuple(sorted(op.shape.items())), tuple(sorted(op.dtypes.items())), op.flops,
              op.bytes, chip.content, run)
    hit = _by_op.get(fields)
    if hit is None:
        hit = _by_op[fields] = _op_time(op, chip, run)
    return hit if hit.op == op.name else dataclasses.replace(hit, op=op.name)


def _op_time(op: Op, chip: Chip, run: OpRun) -> OpTime:
    """op_time by the digest of its disk key: the in-process memo, the disk cache, else the tuned kernel (or the
    roofline of an op kind without a tiling), stored in both."""
    chip = partition(chip, run.cores)
    key = hashlib.blake2b(repr((op.kind, op.unit, sorted(op.shape.items()), sorted(op.dtypes.items()), op.flops,
                                op.bytes, chip.content, run, _code_fingerprint())).encode(), digest_size=16).hexdigest()
    hit = _memo.get(key) or _disk_get(key)
    if hit is None:
        k = kernel_for(op, chip, run.options)
        if k is not None:
            buffering = run.options.buffering if run.options else 0

            def make(cand: Kernel) -> Trace:
                return on_chip(kernel_trace(cand, chip, buffering), ACTIVATION_INPUT.get(cand.name, ""),
                               run.input_on_chip, run.output_on_chip)
            try:
                best = tuned(k, chip, run.launch, make)
            except NpusimError as exc:
                if "deadlock" not in str(exc) or not buffering:
                    raise
                raise NpusimError(f"kernel {k.name} cannot run with buffering {buffering}: its slots "
                                  f"are released in pairs ({exc})", field=f"kernels.{k.name}.buffering") from None
            r = best.result
            hit = OpTime(op.name, op.kind, r.time, r.roofline, r.bound, "engine", _trace_activity(best.trace, r),
                         _aiv_cores(best.trace))
        else:
            hit = _analytic(op, chip, run)
        _disk_put(key, hit)
    _memo[key] = hit
    return hit


def clear_memos() -> None:
    """Forget the in-process op times and tile traces (the disk cache stays)."""
    _memo.clear()
    _by_op.clear()
    _traces.clear()


def partition(chip: Chip, aic: int) -> Chip:
    """The chip as a kernel on a partition of `aic` cube cores sees it: that many AIC with their AIVs, and the
    chip's whole HBM and L2, which the partition's cores draw on at their own DMA rates (hbm>l1: one core cannot
    stream HBM at its fair share of the chip's bandwidth times the core count, so a few cores saturate less of it).
    What the other partition's kernels take meanwhile is the step's business: the two share the chip's servers
    while they run side by side (engine/streams.py). 0 = the whole chip."""
    if not aic or aic == chip.aic.count:
        return chip
    if not 0 < aic < chip.aic.count:
        raise NpusimError(f"a core partition of {aic} AIC must leave cores for the other stream ({chip.name} has "
                          f"{chip.aic.count})", field="streams.attention_cores")
    share = aic / chip.aic.count
    r = dataclasses.replace
    return r(chip, aic=r(chip.aic, count=aic), aiv=r(chip.aiv, count=round(chip.aiv.count * share)))


# The GM tensor holding each kernel's activation input (what a fused group's previous member produced).
ACTIVATION_INPUT = {"gemm": "a", "grouped_gemm": "a", "quant_matmul": "a", "rowwise": "x"}


_traces = ReadsMemo()


def kernel_trace(k: Kernel, chip: Chip, buffering: int = 0) -> Trace:
    """The trace an op runs: the kernel's tiling at the plan's buffering depth, the depth of its double-buffered
    queues (0 = the kernel as written; every kernel is written on the tile-program layer).

    Memoised by the kernel (its every field) and the values of the chip fields its tiling read (npusim.spec.reads):
    a tiling reads core counts and buffer sizes, so sweep points that differ in a rate (HBM bandwidth) build each
    trace once; the engine still times it on each point's own chip."""
    k = dataclasses.replace(k, buffering=buffering) if buffering else k
    return _traces.get((type(k).__module__, type(k).__qualname__, repr(k)), chip, k.trace)


def on_chip(trace: Trace, input_name: str, inputs: bool, outputs: bool) -> Trace:
    """Inside a fused group: reads of the activation input (`input_name`) and writes of the op's outputs (not its
    per-core workspaces) are served by L2 instead of HBM."""
    if not (inputs and input_name) and not outputs:
        return trace

    def instr(i: Instr) -> Instr:
        act = i.action
        if inputs and i.src == "gm" and act is not None and any(r.name == input_name for r in act.ins):
            return dataclasses.replace(i, hit=1.0)
        if outputs and i.dst == "gm" and act is not None and act.out is not None and not act.out.name.startswith("ws."):
            return dataclasses.replace(i, hit=1.0)
        return i

    def body(nodes: tuple[Node, ...]) -> tuple[Node, ...]:
        return tuple(dataclasses.replace(n, body=body(n.body)) if isinstance(n, Loop) else instr(n) for n in nodes)

    groups = tuple(dataclasses.replace(g, aic=Program(g.aic.core, body(g.aic.body)) if g.aic else None,
                                       aiv=tuple(Program(p.core, body(p.body)) for p in g.aiv)) for g in trace.groups)
    return dataclasses.replace(trace, groups=groups)


def _aiv_cores(trace: Trace) -> int:
    return sum(g.copies for g in trace.groups for p in g.aiv if p.body)


def _trace_activity(trace: Trace, r) -> Activity:
    totals = trace.pipe_totals()

    def get(pipe: str, what: str) -> float:
        return totals.get(pipe, {}).get(what, 0.0)

    return Activity(cube_flops=get("cube", "flops"), vector_flops=get("vector", "flops"), hbm_bytes=r.hbm_bytes,
                    l2_bytes=r.l2_bytes, core_bytes=get("mte1", "bytes") + get("fixpipe", "bytes") +
                    get("vector", "bytes"))


@functools.cache
def _code_fingerprint() -> str:
    root = Path(__file__).resolve().parents[1]
    h = hashlib.blake2b(digest_size=16)
    code = sorted((root / "kernels").glob("*.py")) + sorted((root / "engine").glob("*.py"))
    for path in code + [root / "spec" / "chip.py", Path(__file__)]:
        h.update(path.read_bytes())
    return h.hexdigest()


def _cache_dir() -> Path | None:
    """NPUSIM_CACHE (a directory, or 'off'); default ~/.cache/npusim/kernels."""
    where = os.environ.get("NPUSIM_CACHE", str(Path.home() / ".cache" / "npusim" / "kernels"))
    return None if where == "off" else Path(where)


def _disk_get(key: str) -> OpTime | None:
    d = _cache_dir()
    if d is None:
        return None
    try:
        data = json.loads((d / key[:2] / f"{key}.json").read_text())
        data["activity"] = Activity(**data["activity"]) if data.get("activity") else None
        return OpTime(**data)
    except (OSError, ValueError, TypeError):
        return None


def _disk_put(key: str, value: OpTime) -> None:
    d = _cache_dir()
    if d is None:
        return
    try:
        target = d / key[:2] / f"{key}.json"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(value)))
        tmp.replace(target)  # atomic: parallel sweep workers never read half a file
    except OSError:
        pass  # a read-only home is not an error: the in-process memo still works


def _analytic(op: Op, chip: Chip, run: OpRun) -> OpTime:
    """Roofline of the op's FLOPs and bytes, each unit at its calibrated efficiency; inside a fused group the
    activation input and the output move through L2 instead of HBM."""
    eff = chip.efficiency
    on_l2 = ((op.bytes_read - op.weight_bytes) if run.input_on_chip else 0.0) + \
        (op.bytes_written if run.output_on_chip else 0.0)
    hbm = op.bytes - on_l2
    if op.unit == "cube":
        dt = _scheme(op, chip)
        compute = op.flops / chip.peak_cube_flops(dt)
        compute_eff = compute / eff.cube
    else:
        compute = op.flops / chip.peak_vector_flops("fp32")
        compute_eff = compute / eff.vector
    memory = max(hbm / chip.hbm.bandwidth, on_l2 / chip.l2.read_bandwidth)
    memory_eff = max(hbm / (chip.hbm.bandwidth * eff.hbm), on_l2 / (chip.l2.read_bandwidth * eff.l2))
    roof = max(compute, memory)
    bound = "cube" if op.unit == "cube" and compute >= memory else ("vector" if compute >= memory else "hbm")
    cube = op.unit == "cube"
    activity = Activity(cube_flops=op.flops if cube else 0.0, vector_flops=0.0 if cube else op.flops,
                        hbm_bytes=hbm, l2_bytes=on_l2)
    return OpTime(op.name, op.kind, max(compute_eff, memory_eff) + launch_cost(chip, run.launch), roof, bound,
                  "roofline", activity, 0 if cube else chip.aiv.count)
