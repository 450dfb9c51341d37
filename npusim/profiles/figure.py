"""Predicted vs measured device time per op of a profile, on log axes, one colour per kernel."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402


def scatter(ops: pd.DataFrame, path: str | Path, title: str, fitted: pd.Series | None = None) -> Path:
    """Each op's median measured time against its predicted time (filled), and after the fit (hollow, same colour);
    the diagonal is exact, the band +-20 %."""
    fig, ax = plt.subplots(figsize=(6.5, 5.5))
    lo = min(ops["measured_us"].min(), ops["predicted_us"].min()) / 1.5
    hi = max(ops["measured_us"].max(), ops["predicted_us"].max()) * 1.5
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8)
    ax.fill_between([lo, hi], [lo * 0.8, hi * 0.8], [lo * 1.2, hi * 1.2], color="0.9", label="+-20 %")
    for i, (kernel, rows) in enumerate(ops.groupby("kernel", sort=True)):
        colour = f"C{i % 10}"
        ax.scatter(rows["measured_us"], rows["predicted_us"], s=20 + 8 * rows["launches"] ** 0.5, color=colour,
                   label=kernel, zorder=3)
        if fitted is not None:
            ax.scatter(rows["measured_us"], fitted.loc[rows.index], s=40, facecolors="none", edgecolors=colour,
                       zorder=3)
    if fitted is not None:
        ax.scatter([], [], s=40, facecolors="none", edgecolors="k", label="after --fit")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured: msprof Task Duration, median of launches (us)")
    ax.set_ylabel("predicted: npusim, launch mode device (us)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
