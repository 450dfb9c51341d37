"""Fused GEMM + all-reduce (npusim.parallel.overlap): the reduce-scatter hides behind the GEMM, the all-gather does not."""

import pytest

from npusim.engine import completions, simulate
from npusim.kernels import catalog
from npusim.parallel.overlap import gemm_all_reduce
from npusim.spec.system import load_system

SYSTEM = load_system("atlas-800-a2")
GAR = dict(m=5504, n=1536, k=6144, dtype="fp16", out_dtype="fp16")  # pto-isa gemm_ar (K126 / K210)


def test_blocks_are_ready_in_waves_and_the_last_ends_the_gemm():
    chip = SYSTEM.chip_spec
    trace = catalog.kernel("gemm", GAR).trace(chip)
    ready = completions(trace, chip, "fixpipe", "store")
    assert len(ready) == 43 * 6  # the 258 blocks of 128 x 256
    assert ready[-1] == pytest.approx(simulate(trace, chip, launch="none").time, rel=1e-9)
    assert ready[0] < ready[-1] / 5  # the first wave is ready long before the end


def test_reduce_scatter_hides_behind_the_gemm_and_the_all_gather_is_exposed():
    f = gemm_all_reduce(catalog.kernel("gemm", GAR), SYSTEM, 8)
    assert f.gemm + f.all_gather <= f.time < f.sequential
    assert f.time < f.gemm + f.all_gather + 0.2 * f.reduce_scatter  # all but the last blocks' sends hidden
    assert f.hidden == pytest.approx(f.sequential - f.time, rel=1e-6)


def test_one_block_has_nothing_to_overlap():
    f = gemm_all_reduce(catalog.kernel("gemm", dict(m=128, n=256, k=1024, dtype="fp16", out_dtype="fp16")),
                        SYSTEM, 8)
    assert f.time == pytest.approx(f.sequential, rel=1e-6)


def test_a_faster_link_is_never_slower():
    fast = load_system("atlas-800-a2", {"tiers.hccs.bandwidth": "392 GB/s"})
    kern = catalog.kernel("gemm", GAR)
    assert gemm_all_reduce(kern, fast, 8).time < gemm_all_reduce(kern, SYSTEM, 8).time
