"""The one error type users see: a plain sentence naming the file and field, never a traceback.

`file` is where the user wrote the value (a path, or a command-line option such as '--set') and `field` the name
they gave it there, so the sentence reads `FILE, field 'FIELD': ...`, or `--set FIELD: ...` for an option.
"""

from __future__ import annotations

import difflib


class NpusimError(Exception):
    """Bad input or an impossible configuration; the CLI prints it as one sentence and exits 2."""

    def __init__(self, message: str, *, file: str | None = None, field: str | None = None):
        self.file = file
        self.field = field
        self.detail = message
        if file and file.startswith("--"):
            where = f"{file} {field}" if field else file
        elif field and field.startswith("--"):
            where = ", ".join(p for p in (file, field) if p)
        else:
            where = ", ".join(p for p in (file, field and f"field '{field}'") if p)
        super().__init__(f"{where}: {message}" if where else message)


def did_you_mean(name: str, allowed) -> str:
    """Suffix for an 'unknown X' message: the closest allowed name when one is close, and the full list when short."""
    allowed = sorted(allowed)
    close = difflib.get_close_matches(name, allowed, n=1, cutoff=0.7)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    listing = f"; allowed: {', '.join(allowed)}" if len(allowed) <= 20 else ""
    return hint + listing


def as_written(exc: NpusimError, fields: dict[str, dict]) -> NpusimError:
    """`exc` renamed for input that came from a file rather than the command line: a field the API names by its
    option (`--input`) becomes the file and field that wrote it (`fields`: option -> {file:, field:}, as a
    Provenance.where gives them); other errors are unchanged."""
    if exc.file is None and exc.field in fields:
        return NpusimError(exc.detail, **fields[exc.field])
    return exc


def option(key: str) -> str:
    """The command-line option of a predict argument: prefill_batch -> --prefill-batch."""
    return "--" + key.replace("_", "-")
