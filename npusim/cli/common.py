"""Options and output shared by the subcommands: --format, --set, and printing a table as text, JSON or CSV."""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING

from npusim.errors import NpusimError

if TYPE_CHECKING:
    import pandas as pd

FORMATS = ("table", "json", "csv")


def finite(text: str) -> float:
    """argparse type of a number option: NaN and infinity are refused with the option's name, as any bad value."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(text)
    return value


finite.__name__ = "finite number"  # argparse's message: "argument --rate: invalid finite number value: 'inf'"


def seed(text: str) -> int:
    """argparse type of a --seed: a whole number >= 0 (what NumPy's generators take)."""
    value = int(text)
    if value < 0:
        raise ValueError(text)
    return value


seed.__name__ = "seed (a whole number >= 0)"


def add_format(parser) -> None:
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format (default: table)")


def add_set(parser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                        help="override any field by dotted path, e.g. --set hbm.bandwidth=4TB/s (repeatable)")


def parse_overrides(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise NpusimError(f"--set '{item}' must look like FIELD=VALUE, e.g. hbm.bandwidth=4TB/s")
        out[key.strip()] = value.strip()
    return out


def emit(frame: pd.DataFrame, fmt: str, *, title: str | None = None, extra: dict | None = None, out=None) -> None:
    """Print one table; JSON carries `extra` (totals, metadata) beside the rows."""
    import pandas as pd  # here, not at the top: building the parser (every --help) stays light

    out = out or sys.stdout
    if fmt == "json":
        payload = {"rows": json.loads(frame.to_json(orient="records"))}
        if title:
            payload["title"] = title
        if extra:
            payload.update(extra)
        out.write(json.dumps(payload, indent=2, default=str) + "\n")
    elif fmt == "csv":
        frame.to_csv(out, index=False)
    else:
        if title:
            out.write(title + "\n")
        with pd.option_context("display.max_colwidth", 120, "display.width", 250):
            out.write(frame.to_string(index=False) + "\n")
        for key, value in (extra or {}).items():
            out.write(f"{key}: {value}\n")
