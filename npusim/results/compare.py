"""Compare a baseline scenario with variants: a delta table and a waterfall that attributes the change of one metric
to each variant in turn (variant i against variant i-1, so a chain of scenarios that each add one switch reads as
what each switch buys)."""

from __future__ import annotations

from dataclasses import dataclass
from math import nan
from pathlib import Path
from typing import TYPE_CHECKING

from npusim.errors import NpusimError
from npusim.spec.scenario import Scenario, load_scenario

if TYPE_CHECKING:  # imported where used, so that METRICS (the CLI's --metric choices) loads light
    import pandas as pd

    from npusim.results.prediction import Prediction

# metric -> (column, unit scale, lower is better)
METRICS = {
    "ttft": ("TTFT_ms", 1e3, True), "tpot": ("TPOT_ms", 1e3, True),
    "tokens_per_s_per_chip": ("decode_tok_s_chip", 1.0, False),
    "prefill_tokens_per_s_per_chip": ("prefill_tok_s_chip", 1.0, False),
}


@dataclass(frozen=True)
class Comparison:
    """A baseline scenario and its variants, predicted (`npusim.compare`).

    Fields:
        scenarios: the baseline first, then each variant, as loaded (`Scenario`: hw, model, plan, lengths, `set`).
        predictions: the `Prediction` of each scenario, in the same order.

    `table()` puts them side by side with each metric's change against the baseline in %; `steps(metric)` and
    `waterfall(path, metric)` attribute the change of one metric to each variant in turn.
    """

    scenarios: tuple[Scenario, ...]
    predictions: tuple[Prediction, ...]

    def __repr__(self) -> str:
        rows = "; ".join(f"{s.title}: TTFT {p.ttft * 1e3:.1f} ms, TPOT {p.tpot * 1e3:.2f} ms"
                         for s, p in zip(self.scenarios, self.predictions))
        return f"Comparison({len(self.scenarios)} scenarios: {rows})"

    def _repr_html_(self) -> str:
        return self.table().round(2).to_html(index=False)

    def table(self) -> pd.DataFrame:
        """One row per scenario: the metrics, and their change against the baseline (first row) in %."""
        import pandas as pd

        rows = []
        for sc, p in zip(self.scenarios, self.predictions):
            pre = p.prefill is not None  # a decode-only plan has no prefill figures
            rows.append({"scenario": sc.title, "TTFT_ms": p.ttft * 1e3 if pre else nan, "TPOT_ms": p.tpot * 1e3,
                         "decode_tok_s_chip": p.tokens_per_s_per_chip,
                         "prefill_tok_s_chip": p.prefill_tokens_per_s_per_chip if pre else nan,
                         "prefill_mem_GiB": p.memory["prefill"].total / 2**30 if pre else nan,
                         "decode_mem_GiB": p.memory["decode"].total / 2**30,
                         "prefill_J_tok": p.joules_per_token.get("prefill", float("nan")),
                         "decode_J_tok": p.joules_per_token.get("decode", float("nan")),
                         "prefill_TFLOPS_W": p.tflops_per_watt("prefill")})
        frame = pd.DataFrame(rows)
        base = frame.iloc[0]
        for col in ("TTFT_ms", "TPOT_ms", "decode_tok_s_chip", "prefill_mem_GiB", "prefill_J_tok"):
            frame[f"d_{col}_pct"] = 100 * (frame[col] / base[col] - 1)
        frame["switches"] = [", ".join(f"{k}={v}" for k, v in _added(prev, sc).items()) or "-"
                             for prev, sc in zip((None,) + self.scenarios[:-1], self.scenarios)]
        return frame

    def steps(self, metric: str = "ttft") -> pd.DataFrame:
        """The waterfall's bars: each scenario's change of `metric` against the one before."""
        import pandas as pd

        col, scale, _ = METRICS[metric]
        values = [(getattr(p, metric) if getattr(p, metric) is not None else nan) * scale for p in self.predictions]
        return pd.DataFrame({"scenario": [s.title for s in self.scenarios], col: values,
                             "delta": [0.0] + [b - a for a, b in zip(values, values[1:])]})

    def waterfall(self, path: str | Path, metric: str = "ttft") -> Path:
        """Write the waterfall figure (PNG/SVG by suffix)."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        col, _, lower_better = METRICS[metric]
        st = self.steps(metric)
        fig, ax = plt.subplots(figsize=(1.4 * len(st) + 2, 4))
        level = st[col].iloc[0]
        ax.bar(0, level, color="grey")
        ax.text(0, level, f"{level:.4g}", ha="center", va="bottom", fontsize=8)
        for i, d in enumerate(st["delta"].iloc[1:], start=1):
            good = (d < 0) == lower_better
            ax.bar(i, d, bottom=level, color="tab:green" if good else "tab:red")
            ax.text(i, max(level, level + d), f"{d:+.4g}", ha="center", va="bottom", fontsize=8)
            level += d
        ax.bar(len(st), level, color="tab:blue")
        ax.text(len(st), level, f"{level:.4g}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(st) + 1), [st["scenario"].iloc[0]] + [f"+ {s}" for s in st["scenario"].iloc[1:]] +
                      ["result"], rotation=30, ha="right", fontsize=8)
        ax.set_ylabel(col)
        ax.set_title(f"{col}: what each switch buys, applied in turn")
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path


def _added(prev: Scenario | None, sc: Scenario) -> dict[str, str]:
    """Overrides and scenario fields a scenario sets beyond the previous one."""
    if prev is None:
        return {}
    out = {k: v for k, v in sc.set.items() if prev.set.get(k) != v}
    for f in ("hw", "model", "plan", "quant", "input", "output", "batch", "prefill_batch", "context"):
        if getattr(sc, f) != getattr(prev, f):
            out[f] = str(getattr(sc, f))
    return out


def compare(base: str | Scenario, *variants: str | Scenario, overrides: dict[str, str] | None = None) -> Comparison:
    """Predict the baseline and each variant (scenario names, files or objects); `overrides` apply to all of them."""
    from npusim.api import predict

    scs = tuple(s if isinstance(s, Scenario) else load_scenario(s) for s in (base,) + variants)
    preds = []
    for sc in scs:
        args = sc.predict_args()
        args["overrides"] = {**args["overrides"], **(overrides or {})}
        try:
            preds.append(predict(**args))
        except NpusimError as exc:
            raise sc.named(exc) from None
    return Comparison(scs, tuple(preds))
