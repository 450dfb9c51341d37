"""The standard figures of a sweep (matplotlib, Agg): each is drawn only when the sweep varies what it plots."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from npusim.sweeps.spec import SweepSpec  # noqa: E402


def _varying(frame: pd.DataFrame, spec: SweepSpec) -> list[str]:
    swept = list(spec.grid) + sorted({k for p in spec.points for k in p})
    return [k for k in dict.fromkeys(swept) if k in frame and frame[k].astype(str).nunique() > 1]


def _lines(ax, frame: pd.DataFrame, x: str, y: str, scale: float, others: list[str]) -> None:
    groups = frame.groupby([frame[k].astype(str) for k in others]) if others else [((), frame)]
    for label, g in groups:
        g = g.sort_values(x)
        name = ", ".join(f"{k}={v}" for k, v in zip(others, label if isinstance(label, tuple) else (label,)))
        ax.plot(g[x], g[y] * scale, marker="o", label=name or None)
    if others:
        ax.legend(fontsize=7)


def _line_figure(frame, spec, x: str, y: str, scale: float, ylabel: str, title: str, log_x: bool = True):
    vary = _varying(frame, spec)
    if x not in vary:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    _lines(ax, frame, x, y, scale, [k for k in vary if k != x])
    if log_x:
        ax.set_xscale("log", base=2)
    ax.set(xlabel=x, ylabel=ylabel, title=title)
    ax.grid(alpha=0.3)
    return fig


def tpot_vs_batch(frame, spec):
    return _line_figure(frame, spec, "batch", "tpot_s", 1e3, "TPOT (ms)", f"{spec.name}: TPOT vs batch")


def ttft_vs_context(frame, spec):
    return _line_figure(frame, spec, "input", "ttft_s", 1.0, "TTFT (s)", f"{spec.name}: TTFT vs context")


def tokens_vs_chips(frame, spec):
    if frame["chips"].nunique() < 2:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    ax.scatter(frame["chips"], frame["decode_tokens_per_s_per_chip"])
    ax.set(xlabel="chips (prefill + decode)", ylabel="decode tokens/s per chip",
           title=f"{spec.name}: tokens/s per chip vs chips")
    ax.grid(alpha=0.3)
    return fig


def roofline(frame, spec):
    """Each point's prefill and decode step on one rank against the chip's compute and HBM ceilings."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for phase, marker in (("prefill", "s"), ("decode", "o")):
        intensity = frame[f"{phase}_flops_per_rank"] / frame[f"{phase}_hbm_bytes_per_rank"]
        achieved = frame[f"{phase}_flops_per_rank"] / frame[f"{phase}_step_s"] / 1e12
        ax.scatter(intensity, achieved, marker=marker, label=phase)
    for (peak, bw), _ in frame.groupby(["peak_flops_per_rank", "hbm_bandwidth_per_rank"]):
        lo = min(1.0, (frame["decode_flops_per_rank"] / frame["decode_hbm_bytes_per_rank"]).min() / 2)
        xs = [lo, peak / bw, peak / bw * 100]
        ax.plot(xs, [min(peak, x * bw) / 1e12 for x in xs], "k--", lw=0.8)
    ax.set(xscale="log", yscale="log", xlabel="FLOPs per HBM byte (step, one rank)", ylabel="achieved TFLOP/s",
           title=f"{spec.name}: roofline (dashed: bf16 cube peak and HBM ceiling)")
    ax.legend()
    ax.grid(alpha=0.3, which="both")
    return fig


FIGURES = {"tpot_vs_batch": tpot_vs_batch, "ttft_vs_context": ttft_vs_context,
           "tokens_per_chip_vs_chips": tokens_vs_chips, "roofline": roofline}


def write_figures(frame: pd.DataFrame, spec: SweepSpec, out: Path) -> list[Path]:
    """The figures that apply to this sweep, as PNGs in `out`; points that predict refused are left out."""
    ok = frame[frame["error"] == ""] if "error" in frame else frame
    written = []
    if ok.empty:
        return written
    for name, draw in FIGURES.items():
        fig = draw(ok, spec)
        if fig is not None:
            path = out / f"{spec.name}-{name}.png"
            fig.tight_layout()
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written
