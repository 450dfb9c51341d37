"""Progress on a terminal: a tqdm bar on stderr while a plan search, a sweep or a serving run works, and nothing at
all when stderr is not a terminal (pipes, CI logs, tests), so that captured output holds only results."""

from __future__ import annotations

import sys


def progress(total: int | None, desc: str, unit: str, *, enabled: bool = True, initial: int = 0, file=None):
    """A tqdm bar of `total` `unit`s (None: unknown), shown only when `enabled` and `file` (stderr) is a terminal."""
    from tqdm import tqdm

    out = file or sys.stderr
    return tqdm(total=total, desc=desc, unit=unit, initial=initial, file=out, dynamic_ncols=True, leave=False,
                disable=not (enabled and out.isatty()))
