"""Figures of a serving run: latency CDFs and the deployment's state over time.

Built on matplotlib's object API (no pyplot), so they render headless with the Agg canvas and never open a window:
`latency_cdfs(result).savefig("cdf.png")`.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from npusim.serving.result import ServingResult, Slo

_LATENCIES = (("ttft", "TTFT"), ("tpot", "TPOT"), ("itl", "ITL"), ("e2e", "end-to-end"))


def latency_cdfs(result: ServingResult) -> Figure:
    """Empirical CDF of TTFT, TPOT, ITL and end-to-end latency, with the SLO limits drawn where given."""
    fig = Figure(figsize=(10, 7), layout="constrained")
    limits = {"ttft": result.slo and result.slo.ttft, "tpot": result.slo and result.slo.tpot}
    for ax, (name, label) in zip(fig.subplots(2, 2).flat, _LATENCIES):
        values = result.itl if name == "itl" else result.requests[name].to_numpy(dtype=float)
        values = np.sort(values[~np.isnan(values)]) * 1e3
        if values.size:
            ax.step(values, np.arange(1, values.size + 1) / values.size, where="post")
        if limits.get(name):
            ax.axvline(limits[name] * 1e3, color="tab:red", linestyle="--", label="SLO")
            ax.legend(loc="lower right")
        ax.set(title=label, xlabel="ms", ylabel="fraction of requests" if name != "itl" else "fraction of gaps",
               ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    return fig


def timeline(result: ServingResult) -> Figure:
    """Waiting requests, sequences per step and KV-cache usage of every instance over time."""
    fig = Figure(figsize=(10, 8), layout="constrained")
    axes = fig.subplots(3, 1, sharex=True)
    for name, steps in result.steps.groupby("instance", sort=True):
        for ax, column in zip(axes, ("queue", "batch", "kv_usage")):
            ax.step(steps.time, steps[column], where="post", label=name, linewidth=0.8)
    axes[0].set(ylabel="waiting requests")
    axes[1].set(ylabel="sequences per step")
    axes[2].set(ylabel="KV cache in use", xlabel="time (s)", ylim=(0, 1.02))
    if result.steps.instance.nunique() <= 8:
        axes[0].legend(loc="upper left", ncol=4, fontsize="small")
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig


def rate_sweep(rates, summaries, slo: Slo | None = None) -> Figure:
    """p99 TTFT and TPOT, and throughput, against the offered request rate: where the knee leaves the SLO."""
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    axes = fig.subplots(1, 3)
    for ax, name, limit in ((axes[0], "ttft", slo and slo.ttft), (axes[1], "tpot", slo and slo.tpot)):
        ax.plot(rates, [getattr(s, name).p99 * 1e3 for s in summaries], marker="o", label="p99")
        ax.plot(rates, [getattr(s, name).p50 * 1e3 for s in summaries], marker=".", linestyle=":", label="p50")
        if limit:
            ax.axhline(limit * 1e3, color="tab:red", linestyle="--", label="SLO")
        ax.set(title=name.upper(), xlabel="offered rate (requests/s)", ylabel="ms", yscale="log")
        ax.legend()
    axes[2].plot(rates, [s.request_throughput for s in summaries], marker="o", label="throughput")
    if slo is not None:
        axes[2].plot(rates, [s.goodput for s in summaries], marker="s", label="goodput")
    axes[2].plot(rates, rates, color="grey", linestyle=":", label="offered")
    axes[2].set(title="requests/s", xlabel="offered rate (requests/s)")
    axes[2].legend()
    for ax in axes:
        ax.grid(alpha=0.3)
    return fig
