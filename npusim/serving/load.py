"""The load a deployment serves: arrivals (open loop, closed loop, or a recorded trace) and request lengths.

Every random draw comes from the numpy Generator the simulation passes in, in fixed-size blocks, so identical
seeds give identical requests however long the run.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Protocol

import numpy as np

from npusim.errors import NpusimError
from npusim.spec.schema import read_text

BLOCK = 1024  # draws per block: vectorised sampling without tying the stream to the run length

Shape = tuple[int, int, int]  # (input tokens, output tokens, prefix-cache hit tokens) of one request


class Lengths(Protocol):
    """A distribution of token counts (input or output length)."""

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """n lengths, integers >= 1."""
        ...


def _require(condition: bool, field: str, message: str) -> None:
    if not condition:
        raise NpusimError(message, field=field)


@dataclass(frozen=True)
class Fixed:
    """Every request has the same length (the usual benchmark setting)."""

    tokens: int

    def __post_init__(self):
        _require(self.tokens >= 1, "tokens", f"must be at least 1, got {self.tokens}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.full(n, self.tokens, dtype=np.int64)


@dataclass(frozen=True)
class Uniform:
    """Lengths uniform over [low, high], both included."""

    low: int
    high: int

    def __post_init__(self):
        _require(1 <= self.low <= self.high, "low", f"need 1 <= low <= high, got low={self.low}, high={self.high}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.integers(self.low, self.high, size=n, endpoint=True, dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Heavy-tailed lengths as seen in chat traffic: median and log-space sigma, clipped to [low, high]."""

    median: float
    sigma: float
    low: int = 1
    high: int | None = None

    def __post_init__(self):
        _require(math.isfinite(self.median) and self.median >= 1, "median",
                 f"must be a finite number of at least 1, got {self.median}")
        _require(math.isfinite(self.sigma) and self.sigma >= 0, "sigma",
                 f"must be a finite number, not negative, got {self.sigma}")
        _require(self.low >= 1 and (self.high is None or self.high >= self.low), "low",
                 f"need 1 <= low <= high, got low={self.low}, high={self.high}")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        draws = np.rint(rng.lognormal(math.log(self.median), self.sigma, size=n))
        return np.clip(draws, self.low, self.high).astype(np.int64)


@dataclass(frozen=True)
class Sampled:
    """Lengths drawn with replacement from recorded values, e.g. `Sampled(trace.input)`."""

    values: tuple[int, ...]

    def __post_init__(self):
        _require(len(self.values) > 0 and min(self.values) >= 1, "values", "needs at least one length, all >= 1")

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.asarray(self.values, dtype=np.int64)[rng.integers(0, len(self.values), size=n)]


def _shapes(input: Lengths, output: Lengths, prefix_hit: float, rng: np.random.Generator, n: int):
    inputs, outputs = input.sample(rng, n), output.sample(rng, n)
    hits = np.minimum((inputs * prefix_hit).astype(np.int64), inputs - 1)  # at least one prompt token is computed
    return inputs, outputs, hits


def _check_hit(prefix_hit: float) -> None:
    _require(0.0 <= prefix_hit < 1.0, "prefix_hit", f"must be a fraction in [0, 1), got {prefix_hit}")


@dataclass(frozen=True)
class OpenLoop:
    """Requests arrive at `rate` per second whatever the deployment does (like `vllm bench serve --request-rate`).

    Inter-arrival times are gamma distributed with coefficient of variation `cv`: 1 is Poisson, above 1 bursty.
    `prefix_hit` is the fraction of every prompt already in the prefix cache. `max_concurrency` caps the requests in
    flight as bench clients do beside the rate (`--max-concurrency` with `--request-rate`): an arrival beyond the cap
    waits at the client, and its latencies count from when it is sent.
    """

    rate: float
    input: Lengths
    output: Lengths
    cv: float = 1.0
    prefix_hit: float = 0.0
    max_concurrency: int | None = None

    def __post_init__(self):
        _require(self.rate > 0, "rate", f"must be positive (requests/s), got {self.rate}")
        _require(self.max_concurrency is None or self.max_concurrency >= 1, "max_concurrency",
                 f"must be at least 1, got {self.max_concurrency}")
        _require(self.cv > 0, "cv", f"must be positive, got {self.cv}")
        _check_hit(self.prefix_hit)

    def arrivals(self, rng: np.random.Generator) -> Iterator[tuple[float, Shape]]:
        """Endless (arrival time, shape) pairs."""
        shape_k = 1.0 / self.cv**2
        now = 0.0
        while True:
            gaps = rng.gamma(shape_k, 1.0 / (shape_k * self.rate), size=BLOCK)
            inputs, outputs, hits = _shapes(self.input, self.output, self.prefix_hit, rng, BLOCK)
            for gap, i, o, h in zip(gaps.tolist(), inputs.tolist(), outputs.tolist(), hits.tolist()):
                now += gap
                yield now, (i, o, h)


@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` users, each sending its next request the moment the last one finishes
    (like `vllm bench serve --max-concurrency`)."""

    concurrency: int
    input: Lengths
    output: Lengths
    prefix_hit: float = 0.0

    def __post_init__(self):
        _require(self.concurrency >= 1, "concurrency", f"must be at least 1, got {self.concurrency}")
        _check_hit(self.prefix_hit)

    def shapes(self, rng: np.random.Generator) -> Iterator[Shape]:
        """Endless request shapes, in the order users issue them."""
        while True:
            inputs, outputs, hits = _shapes(self.input, self.output, self.prefix_hit, rng, BLOCK)
            yield from zip(inputs.tolist(), outputs.tolist(), hits.tolist())


@dataclass(frozen=True, eq=False)
class Trace:
    """Recorded requests replayed at their arrival times: seconds from the start, lengths, prefix-cache hits."""

    arrival: tuple[float, ...]
    input: tuple[int, ...]
    output: tuple[int, ...]
    prefix_hit: tuple[int, ...]
    source: str = "trace"

    def arrivals(self, rng: np.random.Generator) -> Iterator[tuple[float, Shape]]:
        return zip(self.arrival, zip(self.input, self.output, self.prefix_hit))


Load = OpenLoop | ClosedLoop | Trace

_COLUMNS = ("arrival", "input", "output")  # required; "prefix_hit" optional


def read_trace(path: str | Path) -> Trace:
    """Read a CSV (header row) or JSONL trace with fields arrival (s), input, output and optional prefix_hit
    (tokens). A bad row is reported with the file and its line number."""
    path = Path(path)
    text = read_text(path, str(path))
    rows = _jsonl_rows(path, text) if path.suffix in (".jsonl", ".json", ".ndjson") else _csv_rows(path, text)
    columns: dict[str, list] = {"arrival": [], "input": [], "output": [], "prefix_hit": []}
    for line, row in rows:
        arrival, inp, out, hit = _row(path, line, row)
        if columns["arrival"] and arrival < columns["arrival"][-1]:
            _bad(path, line, f"arrival {arrival} is before the previous row's {columns['arrival'][-1]}; "
                             "sort the trace by arrival time")
        for name, value in zip(columns, (arrival, inp, out, hit)):
            columns[name].append(value)
    if not columns["arrival"]:
        raise NpusimError("the trace has no requests", file=str(path))
    return Trace(*(tuple(v) for v in columns.values()), source=str(path))


def _bad(path: Path, line: int, message: str) -> NoReturn:
    raise NpusimError(f"line {line}: {message}", file=str(path))


def _csv_rows(path: Path, text: str) -> Iterator[tuple[int, dict]]:
    reader = csv.DictReader(text.splitlines())
    header = [h.strip() for h in (reader.fieldnames or [])]
    missing = [c for c in _COLUMNS if c not in header]
    if missing:
        _bad(path, 1, f"the header must name the columns {', '.join(_COLUMNS)} (and optionally prefix_hit); "
                      f"missing {', '.join(missing)}")
    reader.fieldnames = header
    for row in reader:
        if None in row:
            _bad(path, reader.line_num, f"has {len(header) + len(row[None])} fields, the header has {len(header)}")
        yield reader.line_num, row


def _jsonl_rows(path: Path, text: str) -> Iterator[tuple[int, dict]]:
    for line, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except json.JSONDecodeError as exc:
            _bad(path, line, f"is not valid JSON ({exc.msg})")
        if not isinstance(row, dict):
            _bad(path, line, "must be a JSON object with arrival, input, output (and optionally prefix_hit)")
        yield line, row


def _row(path: Path, line: int, row: dict) -> tuple[float, int, int, int]:
    missing = [c for c in _COLUMNS if row.get(c) in (None, "")]
    if missing:
        _bad(path, line, f"missing {', '.join(missing)}")
    try:
        arrival = float(row["arrival"])
    except (TypeError, ValueError):
        _bad(path, line, f"arrival {row['arrival']!r} is not a number of seconds")
    if not (math.isfinite(arrival) and arrival >= 0):
        _bad(path, line, f"arrival {arrival} must be a finite time >= 0 s")
    inp, out = _count(path, line, row, "input", 1), _count(path, line, row, "output", 1)
    hit = _count(path, line, row, "prefix_hit", 0) if row.get("prefix_hit") not in (None, "") else 0
    if hit >= inp:
        _bad(path, line, f"prefix_hit {hit} must be below input {inp} (at least one prompt token is computed)")
    return arrival, inp, out, hit


def _count(path: Path, line: int, row: dict, name: str, least: int) -> int:
    value = row[name]
    try:
        number = float(value)
    except (TypeError, ValueError):
        _bad(path, line, f"{name} {value!r} is not a token count")
    if not (number.is_integer() and number >= least):
        _bad(path, line, f"{name} {value!r} must be a whole number >= {least}")
    return int(number)
