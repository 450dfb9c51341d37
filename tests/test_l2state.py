"""L2 state at a launch (npusim.engine.l2state): a warm replay's footprint is resident when it fits."""

import subprocess
import sys

from npusim.engine import simulate
from npusim.engine.l2state import at_launch, resident, warm
from npusim.kernels import catalog
from npusim.spec.chip import load_chip


def test_warm_replay_of_an_embedding_gather_beats_hbm_but_not_its_roofline():
    """kernels.md K216: 1548 rows of 7168 gathered (22 MB in, 22 MB out) replay in 18.8 us, faster than the A3 die's
    HBM allows; warm, npusim moves them through L2 only and never below the trace's own roofline."""
    chip = load_chip("910c-die")
    t = catalog.kernel("embedding", {"tokens": 1548, "hidden": 7168}).trace(chip)
    cold, hot = simulate(t, chip, launch="none"), simulate(warm(t, chip), chip, launch="none")
    assert resident(t, chip) and hot.time < 0.6 * cold.time
    assert t.hbm_bytes / hot.time > chip.hbm.bandwidth and hot.time >= hot.roofline
    assert hot.servers.get("hbm", 0.0) == 0.0 and cold.servers["hbm"] > 0.3


def test_a_footprint_above_l2_stays_cold():
    chip = load_chip("910c-die")
    t = catalog.kernel("gemm", {"m": 16384, "n": 16384, "k": 8192}).trace(chip)
    assert not resident(t, chip) and warm(t, chip) is t and at_launch(t, chip, "cold") is t


def test_warm_is_never_slower():
    chip = load_chip("910b2")
    for name, shape in (("gemm", {"m": 6, "n": 4096, "k": 512}), ("rowwise", {"rows": 515, "dim": 1536}),
                        ("quantise", {"rows": 1030, "elements": 2304})):
        t = catalog.kernel(name, shape).trace(chip)
        assert simulate(warm(t, chip), chip).time <= simulate(t, chip).time


def test_kernel_sim_takes_the_l2_state():
    run = lambda *a: subprocess.run([sys.executable, "-m", "npusim.cli.main", "kernel", "sim", "embedding", "--hw",  # noqa: E731
                                     "910c-die", "--shape", "tokens=1548,hidden=7168", "--launch", "device", *a],
                                    capture_output=True, text=True)
    cold, hot, bad = run(), run("--l2", "warm"), run("--l2", "hot")
    assert cold.returncode == 0 and hot.returncode == 0 and bad.returncode == 2
    ms = lambda out: float(out.split("time: ")[1].split(" ms")[0])  # noqa: E731
    assert ms(hot.stdout) < ms(cold.stdout)
