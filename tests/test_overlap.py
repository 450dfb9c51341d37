"""Fused GEMM + collective (npusim.parallel.overlap): an all-reduce's reduce-scatter hides behind the GEMM, its
all-gather does not; an all-gather of A hides behind the GEMM of the local rows and of the chunks already arrived."""

import pytest

from npusim.errors import NpusimError

from npusim.engine import completions, simulate
from npusim.engine.tune import tuned
from npusim.kernels import catalog
from npusim.parallel.collectives import Collective, collective_time
from npusim.parallel.overlap import all_gather_gemm, gemm_all_reduce
from npusim.spec.system import load_system

SYSTEM = load_system("atlas-800-a2")
GAR = dict(m=5504, n=1536, k=6144, dtype="fp16", out_dtype="fp16")  # pto-isa gemm_ar (K126 / K210)


def test_blocks_are_ready_in_waves_and_the_gemm_ends_with_their_write_back():
    """The last block stored in L2, the GEMM ends when HBM has what it had not yet written back: at most the last
    wave's 24 blocks."""
    chip = SYSTEM.chip_spec
    trace = catalog.kernel("gemm", GAR, base_m=128, base_n=256).trace(chip)
    ready = completions(trace, chip, "fixpipe", "store")
    assert len(ready) == 43 * 6  # the 258 blocks of 128 x 256
    wave = chip.aic.count * 128 * 256 * 2 / (chip.hbm.bandwidth * chip.efficiency.hbm)
    assert ready[-1] < simulate(trace, chip, launch="none").time <= ready[-1] + wave
    assert ready[0] < ready[-1] / 5  # the first wave is ready long before the end


def test_reduce_scatter_hides_behind_the_gemm_and_the_all_gather_is_exposed():
    f = gemm_all_reduce(catalog.kernel("gemm", GAR), SYSTEM, 8)
    ag = collective_time(Collective("all_gather", 5504 * 1536 * 2, 8), SYSTEM).time
    rs = f.comm - ag
    assert f.gemm + ag <= f.time < f.sequential
    assert f.time < f.gemm + ag + 0.2 * rs  # all but the last blocks' sends hidden
    assert f.hidden == pytest.approx(f.sequential - f.time, rel=1e-6)


def test_one_wave_has_nothing_to_overlap_but_its_write_back():
    """Every output block stored in L2 at once (one wave): the collective starts then, and only the blocks'
    write-back to HBM runs beside it."""
    gemm = catalog.kernel("gemm", dict(m=128, n=256, k=1024, dtype="fp16", out_dtype="fp16"))
    f = gemm_all_reduce(gemm, SYSTEM, 8)
    chip = SYSTEM.chip_spec
    stored = sum(ins.bytes * n for _, ins, n in tuned(gemm, chip, "device").trace.instructions() if ins.dst == "gm")
    assert f.hidden == pytest.approx(stored / (chip.hbm.bandwidth * chip.efficiency.hbm), rel=1e-6)
    assert f.time == pytest.approx(f.sequential - f.hidden, rel=1e-6)


def test_a_faster_link_is_never_slower():
    fast = load_system("atlas-800-a2", {"tiers.hccs.bandwidth": "392 GB/s"})
    kern = catalog.kernel("gemm", GAR)
    assert gemm_all_reduce(kern, fast, 8).time < gemm_all_reduce(kern, SYSTEM, 8).time


AGG = dict(m=16384, n=4096, k=4096, dtype="fp16", out_dtype="fp32")  # pto-isa allgather_gemm, 8 ranks (K213)


def test_all_gather_hides_behind_the_gemm_when_the_gemm_is_longer():
    f = all_gather_gemm(catalog.kernel("gemm", AGG), SYSTEM, 8)
    assert f.comm < f.gemm  # 117 MB gathered in less time than 550 GFLOP
    assert 0.99 * f.gemm <= f.time < f.gemm + f.comm / 8  # all but the first chunk hidden (the split GEMMs' waves
    # differ from the whole GEMM's by a little)


def test_a_short_gemm_waits_for_the_all_gather():
    f = all_gather_gemm(catalog.kernel("gemm", dict(m=2048, n=1024, k=2048, dtype="fp16", out_dtype="fp32")),
                        SYSTEM, 2)
    assert f.comm > f.gemm and f.time >= f.comm  # the last chunk arrives after the local rows are done


def test_more_chunks_overlap_more_and_a_single_rank_is_refused():
    kern = catalog.kernel("gemm", AGG)
    assert all_gather_gemm(kern, SYSTEM, 8, chunks=64).time <= all_gather_gemm(kern, SYSTEM, 8, chunks=1).time
    with pytest.raises(NpusimError, match="group >= 2"):
        all_gather_gemm(kern, SYSTEM, 1)
