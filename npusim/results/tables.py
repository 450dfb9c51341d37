"""Writing a result table: CSV always, and Parquet beside it when pyarrow is installed (it is optional)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pandas as pd


def write_table(frame: pd.DataFrame, stem: str | Path) -> list[Path]:
    """`stem`.csv (and `stem`.parquet with pyarrow); returns the paths written."""
    stem = Path(stem)
    written = [stem.parent / f"{stem.name}.csv"]
    frame.to_csv(written[0], index=False)
    if importlib.util.find_spec("pyarrow") is not None:
        written.append(stem.parent / f"{stem.name}.parquet")
        frame.to_parquet(written[-1], index=False)
    return written
