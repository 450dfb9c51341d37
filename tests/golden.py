"""Golden traces: a canonical form of every kernel's tile trace over a set of shapes, to prove rewrites bit-identical.

The canonical form of a `Trace` is equal exactly when the engine and the functional path behave identically: the
trace's header (kernel, chip, shape, roofline numerators, buffers, tiling, dtype), then per group its copies, block
index and programs, every loop (count, variable) and every instruction with all its fields (pipe, op, bytes, flops,
dtype, src, dst, slot, hit, the DMA issues where not 1, and the functional action), and the flag *semantics*: a
group's flags are renamed by first appearance (program order, waits before sets) to f0, f1, ..., each with its
initial count; flags nobody uses are dropped. Renaming is safe because the engine and the executor know flags only as counting semaphores scoped to a
group (which cores wait on one decides its cross-core delay, and that is kept).

`tests/data/golden_traces.json` holds one digest per case (and, for a subset, the engine's result to the last bit);
`tests/test_golden_traces.py` rebuilds each trace from the current code and compares. When a digest differs:

    python tests/golden.py diff [CASE-SUBSTRING ...] [--ref REV]

builds the same case from the kernels at REV (default: the commit the digests were taken at, f97c817) in a temporary
checkout and prints the first differing line of the two canonical forms with its context. `update` rewrites the
digests from the current code (only when a change is meant to move a trace: say why in the commit).
"""

from __future__ import annotations

import argparse
import difflib
import hashlib
import json
import numbers
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "tests" / "data" / "golden_traces.json"
REF = "f97c817"  # the code the digests were taken from (before the tile-program layer)

# (kernel, shape and options, chip, buffering depth as a plan sets it (0 = the kernel as written))
_G, _GG, _LI = "gemm", "grouped_gemm", "lightning_indexer"
_SFA, _FA, _V4 = "sparse_flash_attention", "flash_attention", "v4_attention"
CASES: list[tuple[str, dict, str, int]] = [
    # GEMM: waves and tails, expert blocks, decode, every dtype scheme, accumulator depth, batch, both block orders
    (_G, {"m": 1000, "n": 640, "k": 512, "base_m": 128, "base_n": 128}, "910b2", 0),
    (_G, {"m": 4096, "n": 4096, "k": 4096}, "910b2", 0),
    (_G, {"m": 4, "n": 7168, "k": 2048}, "910b2", 0),
    (_G, {"m": 200, "n": 300, "k": 700, "dtype": "int8", "out_dtype": "fp32"}, "910b2", 0),
    (_G, {"m": 17, "n": 129, "k": 33, "dtype": "fp16"}, "910b2", 0),
    (_G, {"m": 50, "n": 40, "k": 90, "batch": 3, "base_m": 16, "base_n": 16, "base_k": 32, "step_k": 1,
          "out_dtype": "fp32"}, "910b2", 0),
    (_G, {"m": 768, "n": 32, "k": 64, "base_m": 16}, "910b2", 0),
    (_G, {"m": 96, "n": 160, "k": 300, "dtype": "fp8", "out_dtype": "fp32"}, "950pr", 0),
    (_G, {"m": 512, "n": 1024, "k": 2048, "dtype": "mxfp8"}, "950dt", 0),
    (_G, {"m": 256, "n": 512, "k": 1024, "dtype": "mxfp4"}, "950pr", 0),
    (_G, {"m": 1024, "n": 1024, "k": 1024, "l0c_depth": 1}, "910c-die", 0),
    (_G, {"m": 1024, "n": 1024, "k": 1024, "l0c_depth": 2}, "910c-die", 0),
    (_G, {"m": 6144, "n": 6144, "k": 6144, "dtype": "fp16", "out_dtype": "fp32"}, "910b2", 0),
    (_G, {"m": 8192, "n": 131072, "k": 7168}, "910b2", 0),
    (_G, {"m": 2048, "n": 1536, "k": 7168}, "910c-die", 1),
    (_G, {"m": 2048, "n": 1536, "k": 7168}, "910c-die", 2),
    (_G, {"m": 1000, "n": 640, "k": 512, "base_m": 64, "base_n": 64, "base_k": 64, "step_k": 2, "l0c_depth": 2},
     "910b2", 3),
    (_G, {"m": 64, "n": 7168, "k": 1536, "dtype": "int8"}, "910c-die", 1),
    # grouped GEMM: uneven experts (one empty), INT8, even spread, FP8 on 950, buffering
    (_GG, {"rows": 372, "k": 200, "n": 96, "experts": 5, "counts": "0,37,200,5,130"}, "910b2", 0),
    (_GG, {"rows": 372, "k": 200, "n": 96, "experts": 5, "counts": "0,37,200,5,130", "dtype": "int8",
           "out_dtype": "fp32"}, "910b2", 0),
    (_GG, {"rows": 4096, "k": 7168, "n": 2048, "experts": 16}, "910c-die", 0),
    (_GG, {"rows": 1024, "k": 4096, "n": 1024, "experts": 8, "dtype": "fp8"}, "950pr", 0),
    (_GG, {"rows": 2048, "k": 7168, "n": 4096, "experts": 8}, "910c-die", 1),
    # W8A8 MIX quant matmul: catlass tiles on one block, the split-K form, the tiler's blocks
    ("quant_matmul", {"m": 128, "n": 256, "k": 1024, "base_m": 128, "base_n": 256, "base_k": 128, "step_k": 4,
                      "l0c_depth": 1}, "910b3", 0),
    ("quant_matmul", {"m": 256, "n": 1024, "k": 16384, "base_m": 128, "base_n": 256, "base_k": 128, "step_k": 4,
                      "l0c_depth": 1, "k_split": -1}, "910b3", 0),
    ("quant_matmul", {"m": 64, "n": 7168, "k": 1536}, "910c-die", 0),
    # the projection family: mHC pre (streaming, split K, decode), the MoE gate (groups, hash), the Compressor
    ("mhc_pre", {"tokens": 4096, "streams": 4, "hidden": 4096, "mix": 24, "sinkhorn_iters": 20}, "910c-die", 0),
    ("mhc_pre", {"tokens": 8, "streams": 4, "hidden": 7168, "mix": 4, "sinkhorn_iters": 0}, "910c-die", 0),
    ("mhc_pre", {"tokens": 37, "streams": 4, "hidden": 256, "mix": 24, "block_rows": 16, "k_split": 1}, "910b2", 0),
    ("mhc_pre", {"tokens": 37, "streams": 4, "hidden": 256, "mix": 24, "block_rows": 16, "k_split": 3}, "910b2", 0),
    ("mhc_pre", {"tokens": 16, "streams": 4, "hidden": 4096}, "950dt", 0),
    ("mhc_pre", {"tokens": 512, "streams": 4, "hidden": 4096}, "910c-die", 1),
    ("moe_gate", {"m": 4096, "k": 7168, "n": 256, "topk": 8, "hash": 0, "groups": 8}, "910c-die", 0),
    ("moe_gate", {"m": 16, "k": 4096, "n": 256, "topk": 6, "hash": 1, "groups": 1}, "910b2", 0),
    ("moe_gate", {"m": 300, "k": 4096, "n": 256, "topk": 6, "score": "sqrtsoftplus"}, "950pr", 0),
    ("moe_gate", {"m": 1024, "k": 7168, "n": 256, "topk": 8, "groups": 8}, "910c-die", 1),
    ("compressor", {"m": 4096, "k": 4096, "n": 2048, "ratio": 4, "overlap": 2, "entries": 1024}, "910c-die", 0),
    ("compressor", {"m": 8, "k": 4096, "n": 1024, "ratio": 128, "overlap": 1, "entries": 1}, "910c-die", 0),
    ("compressor", {"m": 8, "k": 4096, "n": 2048, "ratio": 4, "overlap": 2}, "910b2", 0),
    ("compressor", {"m": 4096, "k": 4096, "n": 1024, "ratio": 128, "overlap": 1}, "950dt", 0),
    ("compressor", {"m": 512, "k": 4096, "n": 2048, "ratio": 4, "overlap": 2, "block_rows": 64}, "910b2", 0),
    # the Lightning Indexer: prefill blocks, causal pairs (odd middle), decode key ranges, INT8 / FP8
    (_LI, {"tokens": 4096, "keys": 65536, "causal": 0}, "910b2", 0),
    (_LI, {"tokens": 8, "keys": 512, "heads": 64, "topk": 512, "causal": 0}, "910b2", 0),
    (_LI, {"tokens": 20, "keys": 700, "heads": 64, "topk": 64}, "910b2", 0),
    (_LI, {"tokens": 16, "keys": 1100, "heads": 32, "topk": 100}, "910b2", 0),
    (_LI, {"tokens": 1, "keys": 5000, "heads": 64, "topk": 300, "causal": 0}, "910b2", 0),
    (_LI, {"tokens": 4, "keys": 3000, "heads": 64, "topk": 200, "dtype": "int8"}, "910b2", 0),
    (_LI, {"tokens": 4, "keys": 65536, "batch": 2, "causal": 0, "dtype": "int8"}, "910c-die", 0),
    (_LI, {"tokens": 20, "keys": 700, "heads": 64, "topk": 64, "dtype": "fp8"}, "950pr", 0),
    (_LI, {"tokens": 100, "keys": 100, "heads": 64, "topk": 32, "block_m": 128, "block_n": 32}, "910b2", 0),
    (_LI, {"tokens": 101, "keys": 230, "heads": 64, "topk": 48, "dtype": "int8", "block_m": 128, "block_n": 64},
     "910b2", 0),
    (_LI, {"tokens": 131072, "keys": 131072}, "910c-die", 0),
    (_LI, {"tokens": 8192, "keys": 8192}, "910b2", 0),
    (_LI, {"tokens": 64, "keys": 65536, "batch": 4, "causal": 0}, "910c-die", 0),
    (_LI, {"tokens": 2048, "keys": 2048, "causal": 0}, "910c-die", 1),
    # attention: SFA prefill / decode / split-KV / causal ramps, dense flash attention (MHA, MQA, decode), V4
    (_SFA, {"tokens": 64, "keys": 65536}, "910b2", 0),
    (_SFA, {"tokens": 32, "keys": 8192, "topk": 2048}, "910b2", 0),
    (_SFA, {"tokens": 2, "keys": 131072, "causal": 0}, "910c-die", 0),
    (_SFA, {"tokens": 2, "keys": 4096, "kv_splits": 1}, "910b2", 0),
    (_SFA, {"tokens": 1024, "keys": 1024}, "910b2", 0),
    (_SFA, {"tokens": 131072, "keys": 131072}, "910c-die", 0),
    (_SFA, {"tokens": 8, "keys": 2048, "topk": 512, "block_m": 128}, "950pr", 0),
    (_SFA, {"tokens": 64, "keys": 8192, "batch": 4, "causal": 0}, "910c-die", 2),
    (_FA, {"tokens": 4096, "keys": 4096, "heads": 128, "kv_heads": 128, "pairs": 8390656}, "910b2", 0),
    (_FA, {"tokens": 2, "keys": 32768, "heads": 128, "d_qk": 576, "d_v": 512, "causal": 0}, "910b2", 0),
    (_FA, {"tokens": 2048, "keys": 2048, "kv_heads": 128}, "910b2", 0),
    (_FA, {"tokens": 8192, "keys": 8192, "kv_heads": 128, "causal": 0}, "910c-die", 0),
    (_FA, {"tokens": 256, "keys": 1024, "heads": 16, "kv_heads": 16}, "950dt", 0),
    (_V4, {"tokens": 8, "keys": 8192, "heads": 64, "head_dim": 512, "window": 128, "ratio": 4, "topk": 512},
     "910c-die", 0),
    (_V4, {"tokens": 2, "keys": 131072, "ratio": 128}, "910c-die", 0),
    (_V4, {"tokens": 8192, "keys": 8192, "ratio": 128}, "910c-die", 0),
    (_V4, {"tokens": 1024, "keys": 1024, "ratio": 0}, "950dt", 0),
    (_V4, {"tokens": 512, "keys": 4096, "ratio": 4, "topk": 512, "sink": 0}, "910b2", 0),
    # row-wise and the vector kernels: prefill tiles and decode column splits, every quantisation format
    ("rowwise", {"rows": 5, "dim": 64}, "910b2", 0),
    ("rowwise", {"rows": 4096, "dim": 7168, "op": "layernorm"}, "910c-die", 0),
    ("rowwise", {"rows": 301, "dim": 7168, "block_rows": 1}, "950pr", 0),
    ("rowwise", {"rows": 8192, "dim": 1536}, "910c-die", 1),
    ("rowwise", {"rows": 4096, "dim": 7168, "residual": 1}, "910c-die", 0),  # AddRmsNorm
    ("mhc_post", {"tokens": 8, "streams": 4, "hidden": 4096}, "910c-die", 0),
    ("mhc_post", {"tokens": 4096, "streams": 4, "hidden": 4096}, "950dt", 0),
    ("rope", {"tokens": 4096, "heads": 129, "dim": 64}, "910c-die", 0),
    ("rope", {"tokens": 16, "heads": 64, "dim": 64, "layout": "half"}, "910b2", 0),
    ("rope", {"tokens": 64, "heads": 64, "dim": 128, "layout": "half", "head_loop": 1}, "910c-die", 0),
    ("rope", {"tokens": 1, "heads": 32, "dim": 128, "head_loop": 1}, "910c-die", 0),
    ("sinkhorn", {"rows": 4096, "streams": 4, "iters": 20}, "910c-die", 0),
    ("sinkhorn", {"rows": 7, "streams": 4, "iters": 3, "eps": 0.01}, "910b2", 0),
    ("quantise", {"rows": 4096, "elements": 576}, "910c-die", 0),
    ("quantise", {"rows": 8, "elements": 7168, "dtype": "fp8"}, "950pr", 0),
    ("quantise", {"rows": 64, "elements": 7168, "dtype": "mxfp8"}, "950dt", 0),
    ("quantise", {"rows": 64, "elements": 2048, "dtype": "mxfp4", "block": 0}, "950pr", 0),
    ("quantise", {"rows": 512, "elements": 128, "dtype": "fp8", "block": 128}, "910b2", 0),
    ("dequantise", {"rows": 8, "elements": 7168, "dtype": "mxfp4"}, "950pr", 0),
    ("dequantise", {"rows": 1024, "elements": 576, "dtype": "int8"}, "910b2", 0),
    ("swiglu", {"rows": 4096, "width": 2048, "clamp": 10}, "910c-die", 0),
    ("swiglu", {"rows": 4, "width": 18432}, "910b2", 0),
    ("dequant_swiglu_quant", {"rows": 4096, "width": 2048}, "910c-die", 0),
    ("dequant_swiglu_quant", {"rows": 8, "width": 2048}, "910b2", 0),
    ("dequant_swiglu_quant", {"rows": 64, "width": 18432}, "910c-die", 0),  # the dense MLP's row, cut in chunks
    ("copy", {"rows": 4096, "cols": 7168, "dtype": "bf16", "out_dtype": "fp32"}, "910c-die", 0),  # fp32 router cast
    ("copy", {"rows": 4096, "cols": 64, "repeat": 128}, "910c-die", 0),  # k_rope repeated over 128 heads
    ("moe_combine", {"tokens": 16, "topk": 8, "hidden": 7168}, "910c-die", 0),
    ("moe_combine", {"tokens": 2048, "topk": 6, "hidden": 4096}, "950pr", 0),
    ("embedding", {"tokens": 4096, "hidden": 4096, "streams": 4}, "910c-die", 0),
    ("embedding", {"tokens": 3, "hidden": 7168}, "910b2", 0),
    ("moe_permute", {"rows": 4096, "hidden": 7168, "out_dtype": "int8"}, "910c-die", 0),  # init_routing, W8A8
    ("moe_permute", {"rows": 4096, "hidden": 7168, "dtype": "int8"}, "910c-die", 0),  # re_routing, scales carried
    ("moe_permute", {"rows": 16, "hidden": 7168}, "950pr", 0),  # the un-sort, few rows (column tiles)
    ("cache_update", {"rows": 8, "elements": 576}, "910c-die", 0),
    ("cache_update", {"rows": 4096, "elements": 656}, "950dt", 0),
    ("swiglu", {"rows": 4096, "width": 2048}, "910c-die", 1),
    ("mhc_post", {"tokens": 1024, "streams": 4, "hidden": 4096}, "910c-die", 3),
]


def case_id(kernel: str, shape: dict, chip: str, buffering: int) -> str:
    args = ",".join(f"{k}={v}" for k, v in shape.items())
    return f"{kernel}({args})@{chip}" + (f"/buffering={buffering}" if buffering else "")


def build(kernel: str, shape: dict, chip: str, buffering: int):
    """The trace the op-time path simulates for this kernel, shape and plan buffering depth."""
    from npusim.kernels.catalog import kernel as make
    from npusim.spec.chip import load_chip

    c = load_chip(chip)
    k = make(kernel, shape)
    try:
        from npusim.parallel.optime import kernel_trace
    except ImportError:  # the code before the tile-program layer (diff against REF)
        from npusim.parallel.optime import buffered

        return buffered(k.trace(c), buffering, c)
    return kernel_trace(k, c, buffering)


# ------------------------------------------------------------------------------------------------ canonical form
def fmt(x) -> str:
    """A value exactly and independent of its Python type's spelling (numpy scalars, tuples, dataclasses)."""
    if isinstance(x, bool) or x is None or isinstance(x, str):
        return repr(x)
    if isinstance(x, numbers.Integral):
        return str(int(x))
    if isinstance(x, numbers.Real):
        return repr(float(x))
    if isinstance(x, (tuple, list)):
        return "(" + ",".join(fmt(v) for v in x) + ")"
    if isinstance(x, dict):
        return "{" + ",".join(f"{fmt(k)}:{fmt(v)}" for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))) + "}"
    if hasattr(x, "__dataclass_fields__"):
        return type(x).__name__ + "(" + ",".join(fmt(getattr(x, f)) for f in x.__dataclass_fields__) + ")"
    raise TypeError(f"no canonical form for {type(x).__name__}")


def _nodes(body):
    for node in body:
        if hasattr(node, "count"):
            yield from _nodes(node.body)
        else:
            yield node


def canonical(trace) -> list[str]:
    """The canonical form, one line per group, program, loop and instruction (see the module docstring)."""
    out = [f"trace {trace.kernel} chip={trace.chip} dtype={trace.dtype} flops={fmt(trace.flops)} "
           f"hbm={fmt(trace.hbm_bytes)}", f"shape {fmt(trace.shape)}", f"buffers {fmt(trace.buffers)}",
           f"tiling {fmt(trace.tiling)}"]
    for gi, g in enumerate(trace.groups):
        names: dict[str, int] = {}
        for prog in g.programs:
            for ins in _nodes(prog.body):
                for n in ins.wait + ins.set:
                    names.setdefault(n, len(names))
        out.append(f"group {gi} copies={g.copies} index={g.index} flags={fmt([g.flags.get(n, 0) for n in names])}")
        for prog in g.programs:
            out.append(f"program {prog.core}")
            _lines(prog.body, names, 1, out)
    return out


def _lines(body, names, depth, out) -> None:
    pad = "  " * depth
    for n in body:
        if hasattr(n, "count"):
            out.append(f"{pad}loop {n.count} {n.var!r}")
            _lines(n.body, names, depth + 1, out)
            continue
        w = ",".join(f"f{names[f]}" for f in n.wait)
        s = ",".join(f"f{names[f]}" for f in n.set)
        issues = getattr(n, "issues", 1)  # (the kernels at REF have no such field)
        out.append(f"{pad}{n.pipe} {n.op} bytes={fmt(n.bytes)} flops={fmt(n.flops)} dtype={n.dtype} {n.src}>{n.dst} "
                   f"slot={n.slot} hit={fmt(n.hit)}{f' issues={issues}' if issues != 1 else ''} wait=({w}) set=({s}) "
                   f"act={fmt(n.action)}")


def digest(lines: list[str]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for line in lines:
        h.update(line.encode())
        h.update(b"\n")
    return h.hexdigest()


def engine_record(trace, chip: str) -> dict:
    """What the engine makes of the trace, every float as its exact repr."""
    from npusim.engine.result import simulate
    from npusim.spec.chip import load_chip

    from npusim.errors import NpusimError

    try:
        r = simulate(trace, load_chip(chip), launch="none")
    except NpusimError as exc:  # e.g. a buffering depth the kernel's flags cannot run at
        return {"error": str(exc)}
    return {"time": repr(r.time), "busy": {k: repr(v) for k, v in sorted(r.busy.items())},
            "servers": {k: repr(v) for k, v in sorted(r.servers.items())}, "sync": repr(r.sync),
            "hbm_bytes": repr(r.hbm_bytes), "l2_bytes": repr(r.l2_bytes), "bound": r.bound}


# ------------------------------------------------------------------------------------------------ dev commands
def _select(patterns: list[str]):
    for case in CASES:
        cid = case_id(*case)
        if not patterns or any(p in cid for p in patterns):
            yield cid, case


def update(patterns: list[str]) -> None:
    data = json.loads(DATA.read_text()) if DATA.exists() else {"ref": REF, "cases": {}}
    for cid, (kernel, shape, chip, buf) in _select(patterns):
        trace = build(kernel, shape, chip, buf)
        lines = canonical(trace)
        entry = {"digest": digest(lines), "lines": len(lines), "engine": engine_record(trace, chip)}
        data["cases"][cid] = entry
        print(f"{entry['digest']}  {len(lines):7d} lines  {cid}")
    known = {case_id(*c) for c in CASES}
    data["cases"] = {k: v for k, v in data["cases"].items() if k in known}
    DATA.parent.mkdir(parents=True, exist_ok=True)
    DATA.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _old_lines(ref: str, cid: str) -> list[str]:
    """The canonical form of case `cid` built by the kernels at git revision `ref` (a temporary checkout)."""
    with tempfile.TemporaryDirectory(prefix="npusim-golden-") as tmp:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "npusim", "hardware"], check=True,
                                 capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", tmp], input=archive, check=True)
        env = dict(os.environ, PYTHONPATH=tmp, NPUSIM_HOME=tmp)
        res = subprocess.run([sys.executable, str(Path(__file__).resolve()), "lines", cid], env=env, cwd=tmp,
                             capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"building {cid} at {ref} failed:\n{res.stderr}")
        return res.stdout.splitlines()


def diff(patterns: list[str], ref: str) -> int:
    data = json.loads(DATA.read_text())["cases"]
    bad = 0
    for cid, (kernel, shape, chip, buf) in _select(patterns):
        new = canonical(build(kernel, shape, chip, buf))
        if cid in data and digest(new) == data[cid]["digest"]:
            continue
        bad += 1
        old = _old_lines(ref, cid)
        print(f"== {cid}: differs from {ref} ({len(old)} -> {len(new)} lines)")
        first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), min(len(old), len(new)))
        lo = max(0, first - 6)
        for line in difflib.unified_diff(old[lo:first + 6], new[lo:first + 6], f"{ref}", "current", lineterm="",
                                         n=6):
            print(line)
        print(f"   first difference at line {first + 1}; context: {_context(new, first)}")
    print(f"{bad} case(s) differ")
    return 1 if bad else 0


def _context(lines: list[str], i: int) -> str:
    """Where line i sits: its group, program and enclosing loops."""
    where, depth = [], None
    for line in reversed(lines[:i + 1]):
        ind = (len(line) - len(line.lstrip())) // 2
        if line.startswith(("group", "program")) or (line.strip().startswith("loop") and
                                                      (depth is None or ind < depth)):
            where.append(line.strip())
            depth = ind
        if line.startswith("group"):
            break
    return " / ".join(reversed(where))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("command", choices=("update", "diff", "lines"))
    ap.add_argument("cases", nargs="*", help="substrings of case ids (default: all)")
    ap.add_argument("--ref", default=REF, help="git revision to diff against")
    a = ap.parse_args()
    if a.command == "lines":  # internal: the canonical form of one case, for diff's old checkout
        case = next(c for c in CASES if case_id(*c) == a.cases[0])
        print("\n".join(canonical(build(*case))))
        return 0
    if a.command == "update":
        update(a.cases)
        return 0
    return diff(a.cases, a.ref)


if __name__ == "__main__":
    sys.exit(main())
