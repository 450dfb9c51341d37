"""Measured results beside predictions: a vLLM `bench serve` result JSON, or a CSV of configuration, TTFT and TPOT.

The file gives the scenario (lengths, concurrency) and the measured figures; the deployment it ran on (system, model,
plan, quantisation) comes from the CSV's columns where present, else from the command line.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from npusim import api
from npusim.errors import NpusimError


@dataclass(frozen=True)
class Measured:
    name: str
    run: dict  # predict's arguments
    ttft: float  # seconds
    tpot: float


def _vllm(path: Path, data: dict, defaults: dict) -> list[Measured]:
    """vLLM bench serve: mean lengths from the token totals, the concurrency as the decode batch, medians."""
    need = ("completed", "total_input_tokens", "total_output_tokens", "median_ttft_ms", "median_tpot_ms")
    missing = [k for k in need if k not in data]
    if missing:
        raise NpusimError(f"is not a vLLM bench serve result (no '{missing[0]}')", file=str(path), field=missing[0])
    n = data["completed"]
    if not n:
        raise NpusimError("has no completed requests", file=str(path), field="completed")
    batch = data.get("max_concurrency") or data.get("num_prompts") or n
    run = {**defaults, "input": max(1, round(data["total_input_tokens"] / n)),
           "output": max(1, round(data["total_output_tokens"] / n)), "batch": int(batch)}
    return [Measured(path.stem, run, data["median_ttft_ms"] / 1e3, data["median_tpot_ms"] / 1e3)]


CSV_REQUIRED = ("input", "output", "batch", "ttft_ms", "tpot_ms")
CSV_OPTIONAL = ("name", "hw", "model", "plan", "quant", "context", "prefill_batch")


def _csv(path: Path, defaults: dict) -> list[Measured]:
    try:
        frame = pd.read_csv(path)
    except (OSError, ValueError) as exc:
        raise NpusimError(f"cannot be read as CSV ({exc})", file=str(path)) from None
    missing = [c for c in CSV_REQUIRED if c not in frame]
    if missing:
        raise NpusimError(f"needs columns {', '.join(CSV_REQUIRED)} (missing '{missing[0]}')", file=str(path),
                          field=missing[0])
    for c in CSV_REQUIRED:
        values = pd.to_numeric(frame[c], errors="coerce")
        bad = values.isna() | (values <= 0)
        if bad.any():
            row = int(bad.idxmax()) + 1
            raise NpusimError(f"row {row} has '{frame[c].iloc[row - 1]}', not a positive number", file=str(path),
                              field=c)
        frame[c] = values
    out = []
    for i, r in frame.iterrows():
        run = dict(defaults)
        for c in CSV_REQUIRED[:3] + CSV_OPTIONAL[1:]:
            if c in frame and not (isinstance(r[c], float) and math.isnan(r[c])):
                run[c] = int(r[c]) if c in ("input", "output", "batch", "context", "prefill_batch") else str(r[c])
        name = str(r["name"]) if "name" in frame else f"row {i + 1}"
        out.append(Measured(name, run, float(r["ttft_ms"]) / 1e3, float(r["tpot_ms"]) / 1e3))
    return out


def load_measured(path: str | Path, defaults: dict) -> list[Measured]:
    path = Path(path)
    if not path.exists():
        raise NpusimError("no such file of measurements", file=str(path))
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise NpusimError(f"is not valid JSON ({exc})", file=str(path)) from None
        if not isinstance(data, dict):
            raise NpusimError("is not a vLLM bench serve result (not a JSON object)", file=str(path))
        return _vllm(path, data, defaults)
    return _csv(path, defaults)


def compare(measured: list[Measured], overrides: dict[str, str] | None = None) -> pd.DataFrame:
    """Predicted vs measured TTFT and TPOT per run, with the signed error of the prediction."""
    rows = []
    for m in measured:
        row = {"name": m.name, **{k: m.run.get(k) for k in ("hw", "plan", "input", "output", "batch")},
               "ttft_ms_measured": m.ttft * 1e3, "tpot_ms_measured": m.tpot * 1e3}
        try:
            p = api.predict(**m.run, overrides=overrides)
        except NpusimError as exc:
            rows.append({**row, "error": str(exc)})
            continue
        ttft = p.ttft if p.ttft is not None else math.nan  # a decode-only plan predicts no TTFT
        rows.append({**row, "ttft_ms_predicted": ttft * 1e3, "tpot_ms_predicted": p.tpot * 1e3,
                     "ttft_error_%": 100 * (ttft / m.ttft - 1), "tpot_error_%": 100 * (p.tpot / m.tpot - 1),
                     "error": "", **({"note": "; ".join(p.notes)} if p.notes else {})})
    return pd.DataFrame(rows)
