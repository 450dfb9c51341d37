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


def add_speculative(parser, steps: bool = True) -> None:
    """Speculative decoding as the frameworks launch it: an EAGLE-3 draft model (or the model's own NEXTN / MTP
    layer), its steps and the accept length a bench log reports; they become plan.mtp.* overrides."""
    parser.add_argument("--draft", metavar="CONFIG", default=None,
                        help="EAGLE-3 draft model config.json proposing the drafts (SGLang / vLLM --speculative-"
                             "algorithm EAGLE3, run in BF16); default the model's own MTP layer when the plan has one")
    if steps:
        parser.add_argument("--spec-steps", type=int, default=None, metavar="N",
                            help="draft tokens per step (--speculative-num-steps; verified: N + 1); default the plan's "
                                 "mtp.depth")
    parser.add_argument("--accept-length", type=float, default=None, metavar="L",
                        help="mean tokens a step emits, the accepted drafts plus one (a bench log's 'accept length'); "
                             "default the plan's mtp.acceptance + 1")


def speculative_overrides(args) -> dict[str, str]:
    """The plan.mtp.* overrides of add_speculative's options (bad values are refused by the plan's own checks)."""
    out = {}
    if args.draft is not None:
        out["plan.mtp.draft"] = args.draft
    if getattr(args, "spec_steps", None) is not None:
        out["plan.mtp.depth"] = str(args.spec_steps)
    if args.accept_length is not None:
        if not args.accept_length >= 1:
            raise NpusimError(f"must be at least 1 (the step's own token), got {args.accept_length:g}",
                              field="--accept-length")
        out["plan.mtp.acceptance"] = repr(args.accept_length - 1)
    return out


def parse_overrides(items: list[str], args=None) -> dict[str, str]:
    """--set FIELD=VALUE items (after any speculative options of `args`, which --set may override)."""
    out = speculative_overrides(args) if args is not None and hasattr(args, "draft") else {}
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
