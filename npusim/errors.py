"""The one error type users see: a plain sentence naming the file and field, never a traceback."""

from __future__ import annotations

import difflib


class NpusimError(Exception):
    """Bad input or an impossible configuration; the CLI prints it as one sentence and exits 2."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file = file
        self.field = field
        self.detail = message
        where = ", ".join(p for p in (file and f"{file}", field and f"field '{field}'") if p)
        super().__init__(f"{where}: {message}" if where else message)


def did_you_mean(name: str, allowed) -> str:
    """Suffix for an 'unknown X' message: the closest allowed name, and the full list when short."""
    allowed = sorted(allowed)
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.5)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    listing = f"; allowed: {', '.join(allowed)}" if len(allowed) <= 20 else ""
    return hint + listing
