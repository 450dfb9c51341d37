"""Reading msprof output as the tools write it: one launch (one device task) per data row.

Three files carry per-launch device times:

* `op_summary_*.csv` (msprof / the CANN profiler's mindstudio_profiler_output): `Op Name`, `OP Type`, `Task Type`,
  `Task Duration(us)`, `Block Dim`, `Mix Block Dim`, `Input Shapes`, `Input Data Types`, `Output Shapes`, ... and,
  with `--aic-metrics`, per-pipe ratios (`aic_mac_ratio`, `aiv_vec_ratio`, ...);
* `kernel_details.csv` (Ascend PyTorch Profiler, ASCEND_PROFILER_OUTPUT): the same table renamed by torch_npu
  (`Name`, `Type`, `Accelerator Core`, `Duration(us)`, `Block Num` in recent versions);
* `OpBasicInfo*.csv` (`msprof op`, one per launch directory): `Op Name`, `Op Type` (the kernel type: mix, aiv...),
  `Task Duration(us)`, `Block Dim`, `Mix Block Dim`, `Current Freq`, `Rated Freq` -- no shapes.

Columns are found by name, case- and space-insensitively, under every alias CANN versions have used (Block Dim /
Block Num, Device Id / Device ID, ...); their order is never relied on. Shapes are read as msprof writes them
("m,k;k,n", quoted, an empty entry for an absent optional input). Task Duration is the device time of one launch
(dispatch to the cores, execution, completion), without the host's launch cost.

Limits: the rows' op attributes (layouts, transposes, sparse modes) and the values of small tensors (group lists,
sequence lengths) are not in these files; communication rows (HCCL) record neither message size nor group.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from npusim.errors import NpusimError
from npusim.spec.catalog import display_path

# field -> the column names CANN versions and torch_npu have written for it
COLUMNS = {
    "name": ("Op Name", "Name"),
    "op_type": ("OP Type", "Op Type", "Type"),
    "task_type": ("Task Type", "Accelerator Core", "Accelerator"),
    "duration": ("Task Duration(us)", "Duration(us)"),
    "block_dim": ("Block Dim", "Block Num"),
    "mix_block_dim": ("Mix Block Dim", "Mix Block Num"),
    "input_shapes": ("Input Shapes",),
    "input_dtypes": ("Input Data Types",),
    "output_shapes": ("Output Shapes",),
    "output_dtypes": ("Output Data Types",),
    "freq": ("Current Freq",),
    "rated_freq": ("Rated Freq",),
}
# msprof's per-pipe cycle ratios -> the engine's busy-fraction names (aic = cube core, aiv = vector core)
RATIOS = {"aic_mac_ratio": "aic.cube", "aic_cube_ratio": "aic.cube", "aic_mte1_ratio": "aic.mte1",
          "aic_mte2_ratio": "aic.mte2", "aic_fixpipe_ratio": "aic.fixpipe", "aiv_vec_ratio": "aiv.vector",
          "aiv_mte2_ratio": "aiv.mte2", "aiv_mte3_ratio": "aiv.mte3"}
KINDS = {"kernel_details": ("kernel_details*.csv",), "op_summary": ("op_summary*.csv",),
         "OpBasicInfo": ("OpBasicInfo*.csv",)}
MISSING = {"", "N/A", "NA", "NAN", "NONE"}


@dataclass(frozen=True)
class Tensor:
    """One operand as the row records it; shape () is a scalar."""

    shape: tuple[int, ...]
    dtype: str  # as msprof writes it (DT_BF16, FLOAT16, INT8, ...)


@dataclass(frozen=True)
class Launch:
    """One row: one launch of one kernel on the device."""

    name: str
    op_type: str
    task_type: str
    duration: float  # seconds of device time (Task Duration)
    block_dim: int | None
    mix_block_dim: int | None
    inputs: tuple[Tensor | None, ...] | None  # None: the file records no shapes; an entry None: an absent input
    outputs: tuple[Tensor | None, ...] | None
    ratios: tuple[tuple[str, float], ...]  # measured busy fraction per engine pipe name
    freq_mhz: float | None
    file: str
    row: int


@dataclass(frozen=True)
class Profile:
    path: str
    kind: str  # kernel_details | op_summary | OpBasicInfo
    files: tuple[str, ...]
    launches: tuple[Launch, ...]


def read_profile(path: str | Path) -> Profile:
    """Every launch of a profile file, or of the profile files found under a directory (one kind: torch_npu
    writes the same launches to kernel_details.csv and to op_summary, so kernel_details wins, then op_summary,
    then msprof op's OpBasicInfo)."""
    path = Path(path)
    shown = display_path(path)
    if not path.exists():
        raise NpusimError("no such profile file or directory", file=shown)
    if path.is_dir():
        kind, files = _find(path, shown)
    else:
        kind, files = None, [path]
    launches, kinds = [], set()
    for f in files:
        k, rows = _read(f)
        kinds.add(k)
        launches.extend(rows)
    return Profile(shown, kind or kinds.pop(), tuple(display_path(f) for f in files), tuple(launches))


def _find(root: Path, shown: str) -> tuple[str, list[Path]]:
    for kind, patterns in KINDS.items():
        files = sorted(f for p in patterns for f in root.rglob(p) if f.is_file())
        if files:
            return kind, files
    raise NpusimError("holds no kernel_details.csv, op_summary_*.csv or OpBasicInfo*.csv", file=shown)


def _key(name: str) -> str:
    return re.sub(r"\s+", " ", str(name)).strip().lower()


def _read(path: Path) -> tuple[str, list[Launch]]:
    shown = display_path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise NpusimError("is not a text CSV file (msprof writes UTF-8 CSV)", file=shown) from None
    except OSError as exc:
        raise NpusimError(f"cannot be read ({exc.strerror})", file=shown) from None
    if not text.strip():
        raise NpusimError("is empty: an msprof CSV starts with a header row (Op Name, OP Type, Task Duration(us), "
                          "...)", file=shown)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True, encoding="utf-8-sig")
    except (ValueError, pd.errors.ParserError) as exc:
        raise NpusimError(f"cannot be read as CSV ({str(exc).splitlines()[0]})", file=shown) from None
    cols = {_key(c): c for c in frame.columns}
    found = {f: next((cols[_key(a)] for a in aliases if _key(a) in cols), None) for f, aliases in COLUMNS.items()}
    kind = _kind(found, path.name)
    for need in ("name", "duration") + (("op_type", "task_type") if kind != "OpBasicInfo" else ()):
        if found[need] is None:
            raise NpusimError(f"is not an msprof op summary: it has no column {' or '.join(map(repr, COLUMNS[need]))}"
                              f" (op_summary: Op Name, OP Type, Task Type, Task Duration(us); kernel_details.csv: "
                              f"Name, Type, Accelerator Core, Duration(us); OpBasicInfo: Op Name, Op Type, "
                              f"Task Duration(us))", file=shown, field=COLUMNS[need][0])
    if frame.empty:
        raise NpusimError("has a header but no rows (no launches were profiled)", file=shown)
    ratio_cols = [(c, RATIOS[_key(c)]) for c in frame.columns if _key(c) in RATIOS]
    return kind, [_launch(r, i + 2, found, ratio_cols, kind, shown) for i, r in enumerate(frame.to_dict("records"))]


def _kind(found: dict, filename: str) -> str:
    if found["task_type"] is None and (found["freq"] or found["rated_freq"] or filename.startswith("OpBasicInfo")):
        return "OpBasicInfo"
    return "kernel_details" if found["duration"] and _key(found["duration"]) == "duration(us)" else "op_summary"


def _launch(r: dict, line: int, found: dict, ratio_cols, kind: str, shown: str) -> Launch:
    def get(field: str) -> str:
        col = found[field]
        return str(r[col]).strip() if col is not None else ""

    raw = get("duration")
    duration = _number(raw)
    if duration is None or duration < 0:
        raise NpusimError(f"line {line} has {found['duration']} '{raw}', not a duration in microseconds",
                          file=shown, field=found["duration"])
    name = get("name")
    op_type = get("op_type")
    if kind == "OpBasicInfo" or op_type.upper() in MISSING:
        op_type = op_type_of(name)
    inputs = _tensors(get("input_shapes"), get("input_dtypes"))
    outputs = _tensors(get("output_shapes"), get("output_dtypes"))
    ratios = tuple((pipe, v) for col, pipe in ratio_cols if (v := _number(str(r[col]))) is not None)
    return Launch(name, op_type, get("task_type"), duration * 1e-6, _int(get("block_dim")),
                  _int(get("mix_block_dim")), inputs, outputs, ratios, _number(get("freq")), shown, line)


def op_type_of(name: str) -> str:
    """The op type inside a kernel name: 'LightningIndexer_468c1041..._196865_mix_aic' -> 'LightningIndexer',
    'aclnnMatmul_MatMulCommon_MatMulV2' -> 'MatMulV2'."""
    base = re.sub(r"_(mix_)?ai[cv]$", "", name)
    hashed = re.match(r"(.+?)_[0-9a-f]{16,}(_\d+)?$", base)
    if hashed:
        return hashed.group(1)
    return base.rsplit("_", 1)[-1] if base.startswith("aclnn") else base


def _number(text: str) -> float | None:
    text = text.strip().strip('"').strip()
    if text.upper() in MISSING:
        return None
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


def _int(text: str) -> int | None:
    v = _number(text)
    return int(v) if v is not None and v == int(v) else None


def _tensors(shapes: str, dtypes: str) -> tuple[Tensor | None, ...] | None:
    """'"4096,12288;4608,12288"' with 'FLOAT16;FLOAT16' -> two tensors; None when the row records no shapes."""
    shapes = shapes.replace('"', "").strip()
    if shapes.upper() in MISSING and ";" not in shapes:
        return None
    types = dtypes.replace('"', "").split(";")
    out = []
    for i, item in enumerate(shapes.split(";")):
        dt = types[i].strip() if i < len(types) else ""
        item = item.strip()
        if not item:
            out.append(None if dt.upper() in MISSING else Tensor((), dt))
            continue
        try:
            out.append(Tensor(tuple(int(d) for d in item.split(",")), dt))
        except ValueError:
            return None
    return tuple(out)
