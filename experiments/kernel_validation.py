"""Kernel validation: simulated GEMMs vs the published measurements K20-K24 of shared/reference/published.md.

Regenerates experiments/results/kernel_validation.{csv,md} and kernel_gemm_tflops.png:

    python experiments/kernel_validation.py

Each row runs gemm.py's tiling with the block sizes of the measured kernel, traced and timed by the engine
(npusim.engine) on the chip file, launch overhead included. Two properties of the measured kernels that gemm.py's
defaults do not share are applied to the trace and stated here:
  * pto-isa's A2/A3 kernel (kernels/manual/a2a3/gemm_performance) holds ONE 128x256 fp32 accumulator in L0C
    (128 KiB, the whole L0C), so FIXPIPE's write-out is not overlapped with the next block's mmads: the L0C flag
    depth is 1 where a double-buffered L0C would not fit;
  * those kernels give each core a contiguous C region and walk it so that every A and B panel is fetched from HBM
    about once and re-read from L2 afterwards (B, 75 MB, stays resident in the 192 MiB L2): each load's L2 hit
    fraction is 1 - compulsory bytes / bytes loaded, per operand.
The efficiency parameters and MTE2 start-up latency fitted here are written, with this script named, in the
`efficiency:` and `aic.pipes.mte2.latency_cycles` sources of the chip YAMLs.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from npusim.engine import roofline, simulate  # noqa: E402
from npusim.kernels import catalog  # noqa: E402
from npusim.kernels.base import capacity  # noqa: E402
from npusim.kernels.trace import Instr, Loop, Node, Trace, check_fits  # noqa: E402
from npusim.spec.chip import Chip, load_chip  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Row:
    key: str
    chip: str
    m: int
    n: int
    k: int
    dtype: str
    out_dtype: str
    tiling: dict
    metric: str  # "time" (s) or "tflops"
    published: float
    note: str


PTO_A2A3 = {"base_m": 128, "base_n": 256, "base_k": 64, "step_k": 4}  # gemm_performance_kernel.cpp constants
ROWS = [
    Row("K20", "910c-die", 6144, 6144, 6144, "fp16", "fp32", PTO_A2A3, "time", 1.506e-3,
        "pto-isa manual FP16 GEMM, one die, 24 cores"),
    Row("K21", "910c-die", 7680, 7680, 7680, "fp16", "fp32", PTO_A2A3, "tflops", 286.0, "same kernel, 7680^3"),
    Row("K22", "910b2", 8192, 8192, 8192, "bf16", "bf16", PTO_A2A3, "tflops", 328.0,
        "torch_npu BF16 matmul, 'large square' (8192^3 assumed; SKU not stated, 910B2 assumed)"),
    Row("K23", "950pr", 6144, 6144, 6144, "mxfp8", "bf16", {"base_m": 128, "base_n": 256, "base_k": 128, "step_k": 4},
        "time", 0.6225e-3, "pto-isa MXFP8 GEMM, 32 cores at 1.65 GHz"),
    Row("K24", "950pr", 2048, 8192, 8192, "mxfp4", "bf16", {"base_m": 128, "base_n": 256, "base_k": 256, "step_k": 4},
        "time", 0.3489e-3, "pto-isa MXFP4 GEMM (runs at the FP8 rate, cause unresolved)"),
]


def measured_kernel_trace(row: Row, chip: Chip) -> Trace:
    """gemm.py's trace with the block sizes, accumulator depth and L2 reuse of the measured kernel."""
    kern = catalog.kernel("gemm", {"m": row.m, "n": row.n, "k": row.k}, dtype=row.dtype, out_dtype=row.out_dtype,
                          **row.tiling)
    trace = kern.build(chip)
    groups, buffers = trace.groups, dict(trace.buffers)
    if buffers["l0c"] > chip.aic.buffers.l0c:
        buffers["l0c"] /= 2
        groups = tuple(dataclasses.replace(g, flags={**g.flags, "l0c.free": 1}) for g in groups)
    loaded = {"a": 0.0, "b": 0.0}
    for _, ins, mult in trace.instructions():
        name = _operand(ins)
        if name in loaded:
            loaded[name] += ins.bytes * mult
    size = {"fp16": 2, "bf16": 2, "mxfp8": 1, "mxfp4": 0.5}[row.dtype]
    hits = {"a": 1 - size * row.m * row.k / loaded["a"], "b": 1 - size * row.k * row.n / loaded["b"]}
    groups = tuple(dataclasses.replace(g, aic=dataclasses.replace(g.aic, body=_rehit(g.aic.body, hits)))
                   for g in groups)
    out = dataclasses.replace(trace, groups=groups, buffers=buffers)
    check_fits(out, capacity(chip))
    return out


def _operand(ins: Instr) -> str:
    if ins.pipe == "mte2" and ins.src == "gm" and ins.action is not None and ins.action.ins:
        return ins.action.ins[0].name
    return ""


def _rehit(body: tuple[Node, ...], hits: dict[str, float]) -> tuple[Node, ...]:
    return tuple(dataclasses.replace(n, body=_rehit(n.body, hits)) if isinstance(n, Loop) else
                 dataclasses.replace(n, hit=hits[_operand(n)]) if _operand(n) in hits else n for n in body)


def predict(row: Row) -> dict:
    chip = load_chip(row.chip)
    trace = measured_kernel_trace(row, chip)
    result = simulate(trace, chip)
    tflops = trace.flops / result.time / 1e12
    predicted = result.time if row.metric == "time" else tflops
    return {"row": row.key, "chip": row.chip, "gemm (m x n x k)": f"{row.m}x{row.n}x{row.k}", "dtype": row.dtype,
            "metric": "time (ms)" if row.metric == "time" else "TFLOPS",
            "published": row.published * 1e3 if row.metric == "time" else row.published,
            "predicted": predicted * 1e3 if row.metric == "time" else predicted,
            "error %": 100 * (predicted - row.published) / row.published,
            "TFLOPS": tflops,
            "published TFLOPS": trace.flops / row.published / 1e12 if row.metric == "time" else row.published,
            "peak TFLOPS": chip.peak_cube_flops(trace.dtype) / 1e12,
            "roofline ms": roofline(trace, chip)[0] * 1e3, "bound": result.bound, "note": row.note}


def sweep(chip_name: str, dtype: str, tiling: dict, out_dtype: str) -> pd.DataFrame:
    chip = load_chip(chip_name)
    rows = []
    for size in (512, 1024, 2048, 3072, 4096, 6144, 8192):
        row = Row("", chip_name, size, size, size, dtype, out_dtype, tiling, "time", 0.0, "")
        trace = measured_kernel_trace(row, chip)
        result = simulate(trace, chip)
        rows.append({"size": size, "simulated": trace.flops / result.time / 1e12,
                     "roofline": trace.flops / roofline(trace, chip)[0] / 1e12})
    return pd.DataFrame(rows)


def main() -> None:
    RESULTS.mkdir(exist_ok=True)
    table = pd.DataFrame([predict(r) for r in ROWS])
    table.to_csv(RESULTS / "kernel_validation.csv", index=False, float_format="%.4g")
    md = ["# Kernel validation: simulated GEMMs vs published measurements", "",
          "Regenerated by `python experiments/kernel_validation.py` (see its docstring for the method).", "",
          table.to_markdown(index=False, floatfmt=".4g"), "",
          f"Mean |error| {table['error %'].abs().mean():.1f} %, worst {table['error %'].abs().max():.1f} %."]
    (RESULTS / "kernel_validation.md").write_text("\n".join(md) + "\n")
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for chip_name, dtype, tiling, out, row in (("910c-die", "fp16", PTO_A2A3, "fp32", ROWS[0]),
                                               ("950pr", "mxfp8", ROWS[3].tiling, "bf16", ROWS[3])):
        s = sweep(chip_name, dtype, tiling, out)
        line, = ax.plot(s["size"], s["simulated"], "o-", label=f"{chip_name} {dtype} simulated")
        ax.plot(s["size"], s["roofline"], "--", color=line.get_color(), label=f"{chip_name} {dtype} roofline")
    for _, r in table.iterrows():  # published rows: star = measured, x = simulated, at the row's m
        m = int(r["gemm (m x n x k)"].split("x")[0])
        ax.plot(m, r["published TFLOPS"], "k*", markersize=9)
        ax.plot(m, r["TFLOPS"], "rx", markersize=8)
        ax.annotate(f"{r['row']} {r['dtype']}", (m, r["published TFLOPS"]), textcoords="offset points",
                    xytext=(-28, 8), fontsize=7)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("square GEMM size (m = n = k)")
    ax.set_ylabel("TFLOPS")
    ax.set_title("GEMM TFLOPS vs size: simulated, roofline; published rows (* measured, x simulated)", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(RESULTS / "kernel_gemm_tflops.png", dpi=120)
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
