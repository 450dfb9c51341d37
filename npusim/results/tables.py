"""Writing a result table: CSV (for any tool) and Parquet beside it (typed columns; pyarrow is a dependency)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd


def write_table(frame: pd.DataFrame, stem: str | Path) -> list[Path]:
    """`stem`.csv and `stem`.parquet; returns the paths written."""
    stem = Path(stem)
    written = [stem.parent / f"{stem.name}.csv", stem.parent / f"{stem.name}.parquet"]
    frame.to_csv(written[0], index=False)
    frame.to_parquet(written[1], index=False)
    return written
