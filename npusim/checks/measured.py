"""Measured results beside predictions: a vLLM `bench serve` result JSON, or a CSV of configuration, TTFT and TPOT.

The file gives the scenario (lengths, concurrency) and the measured figures; the deployment it ran on (system, model,
plan, quantisation) comes from the CSV's columns where present, else from the command line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from npusim import api
from npusim.errors import NpusimError
from npusim.spec.schema import read_json


@dataclass(frozen=True)
class Measured:
    name: str
    run: dict  # predict's arguments
    ttft: float  # seconds
    tpot: float


def measurement(value, file: str, field: str, *, whole: bool = False, row: int | None = None):
    """A measured figure as read from a file: a finite number > 0 (a whole number for token and request counts),
    else one sentence naming the file, the field and, for a CSV, the row."""
    at = f"row {row} has " if row is not None else ""
    number = None
    if not isinstance(value, bool):
        try:
            number = float(value)
        except (TypeError, ValueError):
            pass
    if number is None or not math.isfinite(number):
        raise NpusimError(f"{at}{value!r}, not a number", file=file, field=field)
    if number <= 0:
        raise NpusimError(f"{at}{value!r}: a measured figure must be > 0", file=file, field=field)
    if whole:
        if not number.is_integer():
            raise NpusimError(f"{at}{value!r}, not a whole number", file=file, field=field)
        return int(number)
    return number


def _vllm(path: Path, data: dict, defaults: dict) -> list[Measured]:
    """vLLM bench serve: mean lengths from the token totals, the concurrency as the decode batch, medians."""
    need = ("completed", "total_input_tokens", "total_output_tokens", "median_ttft_ms", "median_tpot_ms")
    missing = [k for k in need if k not in data]
    if missing:
        raise NpusimError(f"is not a vLLM bench serve result (no '{missing[0]}')", file=str(path), field=missing[0])
    where = str(path)
    if data["completed"] in (0, 0.0):
        raise NpusimError("has no completed requests", file=where, field="completed")
    n = measurement(data["completed"], where, "completed", whole=True)
    tokens = {k: measurement(data[k], where, k, whole=True) for k in ("total_input_tokens", "total_output_tokens")}
    batch_key = next((k for k in ("max_concurrency", "num_prompts") if data.get(k) is not None), None)
    batch = measurement(data[batch_key], where, batch_key, whole=True) if batch_key else n
    run = {**defaults, "input": max(1, round(tokens["total_input_tokens"] / n)),
           "output": max(1, round(tokens["total_output_tokens"] / n)), "batch": batch}
    return [Measured(path.stem, run, measurement(data["median_ttft_ms"], where, "median_ttft_ms") / 1e3,
                     measurement(data["median_tpot_ms"], where, "median_tpot_ms") / 1e3)]


CSV_REQUIRED = ("input", "output", "batch", "ttft_ms", "tpot_ms")
CSV_OPTIONAL = ("name", "hw", "model", "plan", "quant", "context", "prefill_batch")
CSV_COUNTS = ("input", "output", "batch", "context", "prefill_batch")


def _csv(path: Path, defaults: dict) -> list[Measured]:
    where = str(path)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise NpusimError(f"is not UTF-8 text (byte {exc.start} is 0x{exc.object[exc.start]:02x})", file=where) from None
    except (OSError, ValueError) as exc:
        raise NpusimError(f"cannot be read as CSV ({exc})", file=where) from None
    missing = [c for c in CSV_REQUIRED if c not in frame]
    if missing:
        raise NpusimError(f"needs columns {', '.join(CSV_REQUIRED)} (missing '{missing[0]}')", file=where,
                          field=missing[0])
    if frame.empty:
        raise NpusimError("has a header but no measurements", file=where)
    out = []
    for i, r in enumerate(frame.to_dict("records"), start=1):
        run = dict(defaults)
        for c in CSV_REQUIRED[:3] + CSV_OPTIONAL[1:]:
            if c in r and r[c].strip():
                run[c] = measurement(r[c], where, c, whole=True, row=i) if c in CSV_COUNTS else r[c].strip()
            elif c in CSV_REQUIRED:
                raise NpusimError(f"row {i} has no value", file=where, field=c)
        for c in ("ttft_ms", "tpot_ms"):
            if not r[c].strip():
                raise NpusimError(f"row {i} has no value", file=where, field=c)
        name = r["name"] if r.get("name", "").strip() else f"row {i}"
        out.append(Measured(name, run, measurement(r["ttft_ms"], where, "ttft_ms", row=i) / 1e3,
                            measurement(r["tpot_ms"], where, "tpot_ms", row=i) / 1e3))
    return out


def load_measured(path: str | Path, defaults: dict) -> list[Measured]:
    path = Path(path)
    if not path.exists():
        raise NpusimError("no such file of measurements", file=str(path))
    if path.suffix == ".json":
        data = read_json(path, str(path))
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
                     "ttft_error_pct": 100 * (ttft / m.ttft - 1), "tpot_error_pct": 100 * (p.tpot / m.tpot - 1),
                     "error": "", **({"note": "; ".join(p.notes)} if p.notes else {})})
    return pd.DataFrame(rows)
