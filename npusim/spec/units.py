"""Quantities written as text ("1.6 TB/s", "192 KiB", "1.85 GHz") parsed to SI floats, and formatted back.

SI prefixes (k, M, G, T, P) are powers of 1000 and binary prefixes (Ki, Mi, Gi, Ti) powers of 1024: "64 GB" and
"64 GiB" are different numbers. Bits ("400 Gb/s") are converted to bytes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18}
BINARY = {"Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
SUB = {"": 1.0, "m": 1e-3, "u": 1e-6, "µ": 1e-6, "n": 1e-9, "p": 1e-12}


@dataclass(frozen=True)
class Dimension:
    """A kind of quantity: its base unit (what the float means) and the unit words it accepts."""

    name: str
    base: str
    units: dict[str, float]


def _scaled(symbols: dict[str, float], prefixes: dict[str, float]) -> dict[str, float]:
    return {p + s: f * m for s, f in symbols.items() for p, m in prefixes.items()}


_BYTES = _scaled({"B": 1.0, "b": 0.125}, SI | BINARY)
DIMENSIONS: dict[str, Dimension] = {
    d.name: d
    for d in (
        Dimension("bytes", "B", _BYTES),
        Dimension("bandwidth", "B/s", {u + "/s": f for u, f in _BYTES.items()}),
        Dimension("frequency", "Hz", _scaled({"Hz": 1.0}, SI)),
        Dimension("time", "s", _scaled({"s": 1.0}, SUB)),
        Dimension("power", "W", _scaled({"W": 1.0}, SI | SUB)),
        Dimension("energy", "J", _scaled({"J": 1.0}, SUB | SI)),
        Dimension("money", "USD", {"USD": 1.0, "$": 1.0, "kUSD": 1e3, "MUSD": 1e6}),
        Dimension("number", "", {"": 1.0}),
    )
}

_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?"
_QUANTITY = re.compile(rf"^\s*(?P<num>{_NUMBER})\s*(?P<unit>[^\s\d].*?)?\s*$")


class UnitError(ValueError):
    """Text that is not a quantity of the expected dimension; the loader adds file and field."""


def parse(text, dimension: str) -> float:
    """'1.6 TB/s' -> 1.6e12 for dimension 'bandwidth'. A plain number is only a 'number' (a bandwidth of 2 would be
    2 B/s, never what was meant); NaN and infinity are refused everywhere."""
    dim = DIMENSIONS[dimension]
    if isinstance(text, bool):
        raise UnitError(f"expected a {dim.name} quantity, got {text!r}")
    if isinstance(text, (int, float)):
        if not math.isfinite(text):
            raise UnitError(f"must be a finite number, got {text!r}")
        if dim.name != "number":
            raise UnitError(f"{text!r} has no unit ({_examples(dim)})")
        return float(text)
    m = _QUANTITY.match(str(text))
    if not m:
        raise UnitError(f"'{text}' is not a number with a unit ({_examples(dim)})")
    unit = m["unit"] or ""
    if not unit and dim.name != "number":
        raise UnitError(f"'{text}' has no unit ({_examples(dim)})")
    if unit not in dim.units:
        raise UnitError(f"'{unit}' in '{text}' is not a unit of {dim.name} ({_examples(dim)})")
    value = float(m["num"]) * dim.units[unit]
    if not math.isfinite(value):
        raise UnitError(f"'{text}' is not a finite quantity")
    return value


def _examples(dim: Dimension) -> str:
    if dim.name == "number":
        return "expected a plain number"
    picks = [u for u in dim.units if u in {"B", "KiB", "MiB", "GiB", "GB", "GB/s", "TB/s", "Gb/s", "MHz", "GHz",
                                           "s", "ms", "us", "ns", "W", "kW", "J", "pJ", "USD"}]
    return "use " + ", ".join(picks or list(dim.units)[:6])


_FORMAT_UNITS = {
    "bytes": ["B", "KiB", "MiB", "GiB", "TiB", "PiB"],
    "bandwidth": ["B/s", "kB/s", "MB/s", "GB/s", "TB/s", "PB/s"],
    "frequency": ["Hz", "kHz", "MHz", "GHz"],
    "time": ["ns", "us", "ms", "s"],
    "power": ["mW", "W", "kW", "MW"],
    "energy": ["pJ", "nJ", "uJ", "mJ", "J", "kJ"],
    "money": ["USD", "kUSD", "MUSD"],
    "number": [""],
}


def format(value: float, dimension: str, digits: int = 4) -> str:
    """The largest unit that keeps the mantissa >= 1, e.g. 1.6e12 -> '1.6 TB/s'."""
    dim = DIMENSIONS[dimension]
    if dimension == "number":
        return f"{value:.{max(digits, 6)}g}"
    units = _FORMAT_UNITS[dimension]
    best = units[0]
    for u in units:
        if abs(value) >= dim.units[u] or value == 0 and u == units[0]:
            best = u
    mantissa = value / dim.units[best]
    text = f"{mantissa:.{digits}g}"
    if "e" in text and abs(mantissa) >= 1:  # e.g. 1000 MiB at 3 digits: keep the digits rather than switch to exponent notation
        text = f"{mantissa:.0f}"
    return f"{text} {best}"


def isclose(a: float, b: float, rel: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=rel, abs_tol=0.0)
