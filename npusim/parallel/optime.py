"""Time of one op on one rank: its kernel's tile trace simulated by the engine, or — for an op kind that has no
tiling yet — its roofline at the chip's calibrated efficiencies. Each result says which model produced it.

Ops map onto kernels by kind: linears and absorption BMMs onto the GEMM tiling with the dtype scheme of their
weights; routed experts onto a batched GEMM over the touched experts (rows spread evenly); the Lightning Indexer
onto its tiling with the op's query-key pairs; norms, RoPE and quantisation onto the row-wise vector kernel.
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

from npusim.engine.result import launch_cost, simulate
from npusim.graph.ops import Op
from npusim.kernels.base import KERNELS, Kernel
from npusim.kernels.catalog import kernel
from npusim.kernels.rowwise import ROW_OPS as ROWWISE_OPS
from npusim.spec.chip import Chip

GEMM_SCHEMES = {"bf16": "bf16", "fp16": "fp16", "int8": "int8", "int4": "int8", "fp8": "fp8", "mxfp8": "mxfp8",
                "mxfp4": "mxfp4"}  # int4 weights run the int8 cube path (Ascend W4A8 unpacks to int8)
ROW_OPS = {"rmsnorm": "rmsnorm", "layernorm": "layernorm", "rope": "rope", "quant": "quant_int8"}  # op kind -> row op


@dataclass(frozen=True)
class OpTime:
    op: str
    kind: str
    time: float  # launch included
    roofline: float
    bound: str
    model: str  # "engine" (simulated tile trace) | "roofline" (no tiling yet: roofline / calibrated efficiency)


def _scheme(op: Op, chip: Chip) -> str:
    """The GEMM dtype scheme of the op's weights, or BF16 where the chip's cube has no such mode."""
    dt = GEMM_SCHEMES.get(op.dtypes.get("b", "bf16"), "bf16")
    return dt if dt in chip.aic.cube.flop_per_cycle else "bf16"


ATTENTION = ("sparse_flash_attention", "flash_attention", "v4_attention")


def _dtype(op: Op, key: str, chip: Chip) -> str:
    dt = op.dtypes.get(key, "bf16")
    return dt if dt in chip.aic.cube.flop_per_cycle else "bf16"


def kernel_for(op: Op, chip: Chip) -> Kernel | None:
    """The tiling that implements `op`, or None when the op's kind has no tiling yet.

    Attention-like ops carry their total query-key `pairs`; a `batch` key (sequences, set by the sharding) splits
    `tokens` into per-sequence queries so each sequence's keys are read once.
    """
    s = op.shape
    batch = s.get("batch", 1)
    if op.kind == "gemm":
        return kernel("gemm", {"m": s["m"], "n": s["n"], "k": s["k"], "batch": batch}, dtype=_scheme(op, chip))
    if op.kind == "grouped_gemm":
        return kernel("grouped_gemm", {k: s[k] for k in ("rows", "k", "n", "experts")}, dtype=_scheme(op, chip))
    if op.kind == "lightning_indexer":
        per_seq = max(1, s["tokens"] // batch)
        return kernel("lightning_indexer", {"tokens": per_seq, "keys": max(1, math.ceil(s["pairs"] / s["tokens"])),
                                            "heads": s["heads"], "dim": s["dim"], "topk": s["topk"], "batch": batch},
                      causal=0, dtype=_dtype(op, "q", chip))
    if op.kind in ATTENTION:
        accepted = {f.name for f in dataclasses.fields(KERNELS[op.kind])}
        shape = {k: v for k, v in s.items() if k in accepted and k not in ("tokens", "batch")}
        shape |= {"tokens": max(1, s["tokens"] // batch), "batch": batch, "keys": max(s.get("keys", 1), 1)}
        if op.kind == "flash_attention" and s["d_qk"] != s["d_v"] + 64:
            shape["kv_heads"] = s["heads"]  # MHA mode (V3.1 prefill): every head has its own K and V
        opts = {"dtype": "bf16"} if op.kind == "v4_attention" else {"dtype": "bf16", "causal": 0}
        return kernel(op.kind, shape, **opts)
    if ROW_OPS.get(op.kind) in ROWWISE_OPS:
        rows = s.get("tokens", s.get("rows", 1)) * s.get("heads", 1)
        dim = s.get("width", s.get("dim", s.get("elements", 1)))
        return kernel("rowwise", {"rows": max(1, rows), "dim": dim}, op=ROW_OPS[op.kind])
    return None


_memo: dict[str, OpTime] = {}


def op_time(op: Op, chip: Chip, launch: str = "graph") -> OpTime:
    """Memoised by content, in the process and on disk: identical ops (61 layers, sweep points, later runs) cost
    one simulation. The disk key includes a fingerprint of the kernel and engine code, so edits never reuse stale
    results."""
    key = hashlib.blake2b(repr((op.kind, op.unit, sorted(op.shape.items()), sorted(op.dtypes.items()), op.flops,
                                op.bytes, chip, launch, _code_fingerprint())).encode(), digest_size=16).hexdigest()
    hit = _memo.get(key) or _disk_get(key)
    if hit is None:
        k = kernel_for(op, chip)
        if k is not None:
            r = simulate(k.trace(chip), chip, launch=launch)
            hit = OpTime(op.name, op.kind, r.time, r.roofline, r.bound, "engine")
        else:
            hit = _analytic(op, chip, launch)
        _disk_put(key, hit)
    _memo[key] = hit
    return dataclasses.replace(hit, op=op.name)


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
        return OpTime(**json.loads((d / key[:2] / f"{key}.json").read_text()))
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


def _analytic(op: Op, chip: Chip, launch: str) -> OpTime:
    """Roofline of the op's FLOPs and bytes, each unit at its calibrated efficiency."""
    eff = chip.efficiency
    if op.unit == "cube":
        dt = _scheme(op, chip)
        compute = op.flops / chip.peak_cube_flops(dt)
        compute_eff = compute / eff.cube
    else:
        compute = op.flops / chip.peak_vector_flops("fp32")
        compute_eff = compute / eff.vector
    memory = op.bytes / chip.hbm.bandwidth
    roof = max(compute, memory)
    bound = "cube" if op.unit == "cube" and compute >= memory else ("vector" if compute >= memory else "hbm")
    return OpTime(op.name, op.kind, max(compute_eff, memory / eff.hbm) + launch_cost(chip, launch), roof, bound,
                  "roofline")
