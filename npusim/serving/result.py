"""What a serving run measured: a row per request, a row per instance step, and their summary against an SLO.

Definitions follow `vllm bench serve`: TTFT = first token - arrival; TPOT = (finish - first token) / (output - 1);
ITL = gaps between successive token emissions of a request (an MTP step emitting several tokens is one gap);
end-to-end = finish - arrival. The whole-run figures (ttft, tpot, ..., request / output throughput) are those of
`bench serve`: every request, per second of the observation window with its warm-up and drain. The steady_* figures
are those of the steady window (`steady.steady_window`): the requests arriving after the warm-up and before the
drain, and the tokens and completions inside it per second of it. A run without one (too short; then the steady_*
figures span its first to its last arrival, or the whole window when that has no length) or overloaded says so in
`Summary.steady`, and an overloaded run never meets an SLO. The knee and the planner judge the steady figures.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from functools import cached_property

import numpy as np
import pandas as pd

from npusim.errors import NpusimError
from npusim.serving.steady import SteadyWindow, steady_window
from npusim.spec import units

REQUEST_COLUMNS = ("request", "arrival", "input", "output", "prefix_hit", "generated", "preemptions", "prefill_rank",
                   "decode_rank", "scheduled", "first_token", "finish", "decode_admitted", "prefill_end", "kv_ready")
STEP_COLUMNS = ("time", "instance", "role", "step", "batch", "prefill_tokens", "decode_batch", "queue", "kv_usage")


@dataclass(frozen=True)
class Slo:
    """Latency limits in seconds; a request meets the SLO when it meets every limit given."""

    ttft: float | None = None
    tpot: float | None = None

    def __post_init__(self):
        for name in ("ttft", "tpot"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise NpusimError(f"must be a positive number of seconds, got {value!r}", field=f"slo.{name}")

    @classmethod
    def parse(cls, text: str) -> Slo:
        """'ttft=2s,tpot=30ms' -> Slo(2.0, 0.03); either limit may be left out."""
        limits = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            key = key.strip().lower()
            if not sep or key not in ("ttft", "tpot") or key in limits:
                raise NpusimError(f"'{text}' must look like ttft=2s,tpot=30ms (each at most once)", field="--slo")
            try:
                limits[key] = units.parse(value.strip(), "time")
            except units.UnitError as exc:
                raise NpusimError(f"{key}: {exc}", field="--slo") from None
        return cls(**limits)

    def __str__(self) -> str:
        """The form `parse` reads back exactly, e.g. ttft=2.0s,tpot=0.03s."""
        return ",".join(f"{name}={value!r}s" for name, value in asdict(self).items() if value is not None)


@dataclass(frozen=True)
class Percentiles:
    """Mean and tail of one latency, in seconds (NaN when nothing was measured)."""

    mean: float
    p50: float
    p90: float
    p99: float

    @classmethod
    def of(cls, values) -> Percentiles:
        values = np.asarray(values, dtype=float)
        values = values[~np.isnan(values)]
        if values.size == 0:
            return cls(math.nan, math.nan, math.nan, math.nan)
        p50, p90, p99 = np.percentile(values, [50, 90, 99])
        return cls(float(values.mean()), float(p50), float(p90), float(p99))


@dataclass(frozen=True)
class Summary:
    """Headline figures of a run."""

    requests: int  # arrived
    completed: int
    window: float  # s observed
    request_throughput: float  # completed requests / s
    input_throughput: float  # prompt tokens of completed requests / s
    output_throughput: float  # tokens emitted / s
    ttft: Percentiles
    tpot: Percentiles
    itl: Percentiles
    e2e: Percentiles
    slo_attainment: float | None  # share of judged requests meeting the SLO (None without an SLO)
    goodput: float | None  # requests / s completed within the SLO
    steady_window: float  # s the steady window spans (a run without one: its first to last arrival)
    steady_output_throughput: float  # tokens emitted inside the steady window / s
    steady_request_throughput: float  # requests completed inside the steady window / s
    steady_ttft: Percentiles  # of the requests arriving inside the steady window
    steady_tpot: Percentiles
    steady_e2e: Percentiles
    steady_slo_attainment: float | None  # share of them meeting the SLO (judged as slo_attainment)
    steady_goodput: float | None  # of them, those meeting the SLO per second of the window
    mean_waiting: float  # requests waiting for admission (a queue), time average over the window
    mean_in_system: float  # requests arrived and not finished, time average over the window
    mean_batch: float  # sequences per step, mean over steps
    kv_usage: float  # share of KV cache in use, mean over steps weighted by step time
    preemptions: int
    steady: SteadyWindow  # where the run was steady, or why it was not

    def meets(self, slo: Slo, percentile: str = "p99") -> bool:
        """TTFT and TPOT of the steady window at `percentile` ('mean', 'p50', 'p90', 'p99') within every limit the
        SLO gives, and the run not overloaded: what a planner asks of a deployment under load (NaN, nothing measured,
        never meets)."""
        return not self.misses(slo, percentile)

    def misses(self, slo: Slo, percentile: str = "p99") -> tuple[str, ...]:
        """The latencies ('ttft', 'tpot') whose `percentile` over the steady window is above the SLO's limit for
        them, then 'steady' when the run was overloaded (its load grew without bound: no percentile of it holds)."""
        late = tuple(name for name, limit in (("ttft", slo.ttft), ("tpot", slo.tpot))
                     if limit is not None and not getattr(getattr(self, f"steady_{name}"), percentile) <= limit)
        return late + (("steady",) if self.steady.verdict == "overloaded" else ())

    def flat(self) -> dict[str, float | int | None]:
        """One row for a table across runs (a rate sweep): latencies become ttft_p99 and so on."""
        row = {}
        for key, value in asdict(self).items():
            if isinstance(value, dict):
                row.update({f"{key}_{stat}": v for stat, v in value.items()})
            else:
                row[key] = value
        return row


@dataclass(frozen=True, eq=False)
class ServingResult:
    """Per-request table (`requests`), per-step table (`steps`), every inter-token gap (`itl`) and the summary."""

    requests: pd.DataFrame
    steps: pd.DataFrame
    itl: np.ndarray
    window: float
    slo: Slo | None
    mean_waiting: float  # requests waiting for admission, exact time average over the window
    mean_in_system: float  # requests arrived and not finished, exact time average over the window
    emissions: np.ndarray  # (time, tokens) of every token emission, in time order

    @classmethod
    def of(cls, requests: pd.DataFrame, steps: pd.DataFrame, itl: np.ndarray, window: float, slo: Slo | None,
           mean_waiting: float, mean_in_system: float, emissions: np.ndarray) -> ServingResult:
        """Add the derived latency columns to the raw tables."""
        requests = requests.assign(
            ttft=requests.first_token - requests.arrival,
            tpot=(requests.finish - requests.first_token) / (requests.output - 1).where(requests.output > 1),
            e2e=requests.finish - requests.arrival,
            queue_wait=requests.scheduled - requests.arrival,
        )
        return cls(requests, steps, itl, window, slo, mean_waiting, mean_in_system, emissions)

    def met_slo(self) -> pd.Series:
        """Per request: finished and within every SLO limit (a single-token request has no TPOT to miss)."""
        r, slo = self.requests, self.slo or Slo()
        ok = r.finish.notna()
        if slo.ttft is not None:
            ok &= r.ttft <= slo.ttft
        if slo.tpot is not None:
            ok &= r.tpot.isna() | (r.tpot <= slo.tpot)
        return ok

    def _attainment(self, measured: pd.Series, span: float) -> tuple[float | None, float | None]:
        """SLO attainment and goodput of the `measured` requests over `span` seconds (None, None without an SLO)."""
        if self.slo is None:
            return None, None
        r, window = self.requests, self.window
        met = self.met_slo() & measured
        # unfinished requests count once their TTFT limit has already passed unmet, else they are not judged
        late = r.first_token.isna() & ((window - r.arrival) > (self.slo.ttft or math.inf))
        judged = int(((r.finish.notna() | late) & measured).sum())
        return (float(met.sum() / judged) if judged else math.nan), (float(met.sum() / span) if span else 0.0)

    @cached_property
    def summary(self) -> Summary:
        r, s, window = self.requests, self.steps, self.window
        done = r.finish.notna()
        attainment, goodput = self._attainment(pd.Series(True, index=r.index), window)
        busy = s.step.sum()
        steady = steady_window(r)
        start, end = (steady.start, steady.end) if steady.end > steady.start else (0.0, window)
        span = end - start
        inside = r.arrival.between(start, end)
        steady_attainment, steady_goodput = self._attainment(inside, span)
        return Summary(
            requests=len(r), completed=int(done.sum()), window=window,
            request_throughput=float(done.sum() / window),
            input_throughput=float(r.input[done].sum() / window),
            output_throughput=float(r.generated.sum() / window),
            ttft=Percentiles.of(r.ttft), tpot=Percentiles.of(r.tpot), itl=Percentiles.of(self.itl),
            e2e=Percentiles.of(r.e2e),
            slo_attainment=attainment, goodput=goodput, steady_window=span,
            steady_output_throughput=float(self._tokens_between(start, end) / span) if span else 0.0,
            steady_request_throughput=float(r.finish.between(start, end).sum() / span) if span else 0.0,
            steady_ttft=Percentiles.of(r.ttft[inside]), steady_tpot=Percentiles.of(r.tpot[inside]),
            steady_e2e=Percentiles.of(r.e2e[inside]), steady_slo_attainment=steady_attainment,
            steady_goodput=steady_goodput,
            mean_waiting=self.mean_waiting, mean_in_system=self.mean_in_system,
            mean_batch=float(s.batch.mean()) if len(s) else 0.0,
            kv_usage=float((s.kv_usage * s.step).sum() / busy) if busy else 0.0,
            preemptions=int(r.preemptions.sum()), steady=steady,
        )

    def _tokens_between(self, start: float, end: float) -> float:
        t, n = self.emissions[:, 0], self.emissions[:, 1]
        return float(n[(t >= start) & (t <= end)].sum())

    def latency_table(self, steady: bool = False) -> pd.DataFrame:
        """TTFT, TPOT, ITL and end-to-end latency in milliseconds: mean, p50, p90, p99; `steady`: TTFT, TPOT and
        end-to-end of the steady window's requests (ITL, kept per gap and not per request, is the whole run's)."""
        rows = [{"metric": name, **{k: v * 1e3 for k, v in asdict(getattr(
                    self.summary, f"steady_{name}" if steady and name != "itl" else name)).items()}}
                for name in ("ttft", "tpot", "itl", "e2e")]
        return pd.DataFrame(rows).rename(columns=lambda c: c if c == "metric" else f"{c}_ms")

    def to_json(self) -> dict:
        """The summary (seconds, requests/s, tokens/s) and the SLO, ready for json.dumps."""
        return {"summary": _finite(asdict(self.summary)), "slo": asdict(self.slo) if self.slo else None}


def _finite(tree):
    """NaN is not JSON: write null."""
    if isinstance(tree, dict):
        return {k: _finite(v) for k, v in tree.items()}
    return None if isinstance(tree, float) and math.isnan(tree) else tree


def knee(rates, summaries, slo: Slo | None, percentile: str = "p99") -> float | None:
    """The lowest offered rate at which the SLO is missed at `percentile` over the steady window — TTFT or TPOT,
    whichever limits it gives, or an overloaded run (None: no SLO, or it is met at every rate). Rates in increasing
    order, one summary each."""
    if slo is None or (slo.ttft is None and slo.tpot is None):
        return None
    return next((rate for rate, s in zip(rates, summaries) if s.misses(slo, percentile)), None)
