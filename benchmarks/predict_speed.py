"""Wall time of `npusim predict` on the bundled default, with a cold and then a warm kernel memo.

Run: python benchmarks/predict_speed.py   (prints figures; speed targets live here, not in timed tests)
Target (issue 6): a full prediction of the bundled default in under 2 s on one core. Kernel results are
memoised in the process and on disk (NPUSIM_CACHE, default ~/.cache/npusim/kernels); this script starts from an
empty cache directory.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time

os.environ["NPUSIM_CACHE"] = tempfile.mkdtemp()  # an empty disk cache: the first prediction is truly cold

from npusim import api  # noqa: E402


def main() -> None:
    t0 = time.perf_counter()
    first = api.predict()
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    api.predict(batch=api.DEFAULT["batch"] // 2)
    warm_new_batch = time.perf_counter() - t0
    t0 = time.perf_counter()
    api.predict()
    warm_same = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "npusim.cli.main", "predict"], check=True, capture_output=True)
    process = time.perf_counter() - t0  # a new process: empty in-process memo, warm disk cache
    print(f"default prediction: TTFT {first.ttft * 1e3:.1f} ms, TPOT {first.tpot * 1e3:.2f} ms")
    print(f"cold (empty memo and disk cache)       {cold:6.2f} s")
    print(f"warm memo, new decode batch            {warm_new_batch:6.2f} s")
    print(f"warm memo, same scenario               {warm_same:6.2f} s")
    print(f"new CLI process, warm disk cache       {process:6.2f} s  (includes interpreter and imports)")


if __name__ == "__main__":
    main()
