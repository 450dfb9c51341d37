"""Wall time of regenerating the kernel validation table (experiments/kernel_validation.py), cold.

Run: python benchmarks/kernel_validation_speed.py   (prints figures; speed targets live here, not in timed tests)
Target (issue 14 item 5): the whole table regenerates in under 30 s on 2 cores. The table simulates every row in
a fresh process with an empty in-process memo (kernel_validation.py does not use the disk cache), so this times
the script as a user runs it, interpreter start and imports included, and then splits out the slowest rows.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

import kernel_validation as kv  # noqa: E402

from npusim.engine import clear_memo  # noqa: E402


def main() -> None:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "experiments" / "kernel_validation.py")], check=True,
                   capture_output=True, cwd=ROOT)
    whole = time.perf_counter() - t0
    cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
    rows = kv.pd.read_csv(kv.ROWS, keep_default_na=False, dtype={"variant": str})
    clear_memo()
    times = []
    for _, row in rows.iterrows():
        t0 = time.perf_counter()
        kv.predict(row)
        times.append((time.perf_counter() - t0, kv.key(row)))
    times.sort(reverse=True)
    print(f"kernel validation table, {len(rows)} rows: {whole:.1f} s wall as a fresh process (target < 30 s on 2 "
          f"cores), {cpu.ru_utime + cpu.ru_stime:.1f} s CPU over its {kv.WORKERS} workers (a shared machine's wall "
          "time is at least CPU / 2)")
    print(f"rows alone: {sum(t for t, _ in times):.1f} s; slowest: "
          + ", ".join(f"{k} {t:.2f} s" for t, k in times[:6]))


if __name__ == "__main__":
    main()
