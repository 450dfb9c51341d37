"""Regression baselines: named scenarios with their recorded TTFT, TPOT, throughput and memory, and tolerances.

A change that moves a prediction beyond its tolerance is drift: `npusim check` exits non-zero until the baseline
is rewritten knowingly with `--update`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from npusim import api
from npusim.errors import NpusimError, as_written, did_you_mean, option
from npusim.results.prediction import Prediction
from npusim.spec.schema import read_yaml, setting

METRICS = {  # recorded name -> how it is read from a prediction
    "ttft_s": lambda p: p.ttft,
    "tpot_s": lambda p: p.tpot,
    "tokens_per_s_per_chip": lambda p: p.tokens_per_s_per_chip,
    "prefill_memory_gib": lambda p: p.memory["prefill"].total / 2**30 if "prefill" in p.memory else None,
    "decode_memory_gib": lambda p: p.memory["decode"].total / 2**30,
}
DEFAULT_TOLERANCE = 1e-3  # relative; predictions are deterministic, so any real change shows
RUN_KEYS = ("hw", "model", "plan", "input", "output", "batch", "prefill_batch", "context", "quant")
COUNT_KEYS = ("input", "output", "batch", "prefill_batch", "context")
HEADER = ("# Regression baseline of the shipped scenarios: `npusim check workloads/baselines/default.yaml`.\n"
          "# When a change moves a prediction on purpose, rewrite the values with `--update` and commit them.\n")


@dataclass
class Scenario:
    name: str
    run: dict
    overrides: dict = field(default_factory=dict)
    expect: dict = field(default_factory=dict)
    tolerance: dict = field(default_factory=dict)

    def predict(self, file: str, extra: dict[str, str] | None = None) -> Prediction:
        run = {**self.run, "quant": None} if self.run.get("quant") == "model" else self.run  # as --quant model
        try:
            return api.predict(**run, overrides={**self.overrides, **(extra or {})})
        except NpusimError as exc:
            raise as_written(exc, {option(k): {"file": file, "field": f"scenarios.{self.name}.run.{k}"}
                                   for k in RUN_KEYS}) from None


@dataclass
class Baseline:
    file: str
    scenarios: list[Scenario]
    tolerance: dict

    @classmethod
    def load(cls, path: str | Path) -> Baseline:
        path = Path(path)
        if not path.exists():
            raise NpusimError("no such baseline file", file=str(path))
        data = read_yaml(path, str(path))
        where = str(path)
        tol = _tolerances(data.get("tolerance") or {}, where, "tolerance")
        raw = data.get("scenarios")
        if not isinstance(raw, dict) or not raw:
            raise NpusimError("must map scenario names to {run: ..., expect: ...}", file=where, field="scenarios")
        out = []
        for name, body in raw.items():
            f = f"scenarios.{name}"
            if not isinstance(body, dict) or not isinstance(body.get("run"), dict):
                raise NpusimError("needs a 'run' mapping of predict arguments", file=where, field=f"{f}.run")
            bad = set(body) - {"run", "set", "expect", "tolerance"}
            if bad:
                raise NpusimError("is not a key of a scenario (allowed: run, set, expect, tolerance)", file=where,
                                  field=f"{f}.{sorted(map(str, bad))[0]}")
            run = {str(k): _run_value(str(k), v, where, f"{f}.run.{k}") for k, v in body["run"].items()}
            overrides = body.get("set") or {}
            if not isinstance(overrides, dict):
                raise NpusimError("must map dotted fields to values, as --set (e.g. hbm.bandwidth: 4TB/s)",
                                  file=where, field=f"{f}.set")
            for k, v in overrides.items():
                if v is None or isinstance(v, (dict, list)):
                    raise NpusimError(f"must be a single value, got {v!r}", file=where, field=f"{f}.set.{k}")
            expect = body.get("expect") or {}
            if not isinstance(expect, dict):
                raise NpusimError(f"must map metrics ({', '.join(METRICS)}) to recorded values", file=where,
                                  field=f"{f}.expect")
            bad = set(expect) - set(METRICS)
            if bad:
                raise NpusimError(f"unknown metric '{sorted(map(str, bad))[0]}' (allowed: {', '.join(METRICS)})",
                                  file=where, field=f"{f}.expect")
            out.append(Scenario(str(name), run,
                                {str(k): setting(v, where, f"{f}.set.{k}") for k, v in overrides.items()},
                                {k: _number(v, where, f"{f}.expect.{k}") for k, v in expect.items()},
                                _tolerances(body.get("tolerance") or {}, where, f"{f}.tolerance")))
        return cls(where, out, tol)

    def write(self, path: str | Path) -> None:
        doc = {"tolerance": self.tolerance, "scenarios": {}}
        for s in self.scenarios:
            body = {"run": s.run}
            if s.overrides:
                body["set"] = {k: str(v) for k, v in s.overrides.items()}
            if s.tolerance:
                body["tolerance"] = s.tolerance
            body["expect"] = s.expect
            doc["scenarios"][s.name] = body
        Path(path).write_text(HEADER + yaml.safe_dump(doc, sort_keys=False))


def _tolerances(raw, where: str, field_: str) -> dict:
    if not isinstance(raw, dict) or any(k not in METRICS for k in raw):
        raise NpusimError(f"must map metrics ({', '.join(METRICS)}) to relative tolerances", file=where, field=field_)
    return {k: _number(v, where, f"{field_}.{k}", least=0.0) for k, v in raw.items()}


def _number(value, where: str, field_: str, least: float | None = None) -> float:
    """A recorded figure or tolerance: a finite number (>= `least` when given)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise NpusimError(f"must be a finite number, got {value!r}", file=where, field=field_)
    if least is not None and value < least:
        raise NpusimError(f"must be >= {least:g}, got {value!r}", file=where, field=field_)
    return float(value)


def _run_value(key: str, value, where: str, field_: str):
    """One of predict's arguments as the baseline gives it: a name, or a whole number of tokens or requests."""
    if key not in RUN_KEYS:
        raise NpusimError("is not an argument of predict" + did_you_mean(key, RUN_KEYS), file=where, field=field_)
    if key in COUNT_KEYS:
        least = 0 if key == "context" else 1
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise NpusimError(f"must be a whole number >= {least}, got {value!r}", file=where, field=field_)
        return value
    if not isinstance(value, str) or not value:
        raise NpusimError(f"must be a name, got {value!r}", file=where, field=field_)
    return value


@dataclass(frozen=True)
class Comparison:
    scenario: str
    metric: str
    baseline: float
    predicted: float
    tolerance: float
    note: str = ""
    error: NpusimError | None = None  # why the scenario could not be predicted

    @property
    def change(self) -> float:
        return (self.predicted - self.baseline) / abs(self.baseline) if self.baseline else float("inf")

    @property
    def ok(self) -> bool:
        return not self.note and abs(self.change) <= self.tolerance

    def row(self) -> dict:
        return {"scenario": self.scenario, "metric": self.metric, "baseline": self.baseline,
                "predicted": self.predicted, "change_pct": 100 * self.change, "tolerance_pct": 100 * self.tolerance,
                "status": "ok" if self.ok else (self.note.partition(":")[0] or "DRIFT")}


def check(baseline: Baseline, overrides: dict[str, str] | None = None) -> tuple[list[Comparison], Baseline]:
    """Every scenario predicted and compared; also returns the baseline with the new values (for --update)."""
    rows, updated = [], []
    for s in baseline.scenarios:
        try:
            p = s.predict(baseline.file, overrides)
        except NpusimError as exc:
            rows.append(Comparison(s.name, "prediction", float("nan"), float("nan"), 0.0, f"error: {exc}", exc))
            updated.append(s)
            continue
        new = {m: float(v) for m in METRICS if (v := METRICS[m](p)) is not None}  # decode-only: no prefill metrics
        for m in s.expect.keys() - new.keys():
            rows.append(Comparison(s.name, m, s.expect[m], float("nan"), 0.0, "gone: " + "; ".join(p.notes)))
        for m, value in new.items():
            if m in s.expect:
                tol = s.tolerance.get(m, baseline.tolerance.get(m, DEFAULT_TOLERANCE))
                rows.append(Comparison(s.name, m, s.expect[m], value, tol))
            else:
                rows.append(Comparison(s.name, m, float("nan"), value, 0.0, "new"))
        updated.append(Scenario(s.name, s.run, s.overrides, new, s.tolerance))
    return rows, Baseline(baseline.file, updated, baseline.tolerance)
