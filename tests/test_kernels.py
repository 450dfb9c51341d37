"""Kernel tilings: traces fit the chip, follow Huawei's blocks, stay compressed, refuse what does not fit."""

import pytest

from npusim.errors import NpusimError
from npusim.kernels import catalog
from npusim.kernels.base import cdiv
from npusim.engine import simulate
from npusim.engine.sim import Simulation
from npusim.kernels.trace import unroll
from npusim.spec.chip import load_chip


@pytest.fixture(scope="module")
def chip():
    return load_chip("910b2")


def test_gemm_waves_fold_into_full_and_tail_groups(chip):
    t = catalog.kernel("gemm", {"m": 1000, "n": 640, "k": 512, "base_m": 128, "base_n": 128}).trace(chip)
    blocks = t.tiling["blocks"]
    assert blocks == 8 * 5
    assert sum(g.copies for g in t.groups) == chip.aic.count
    assert sorted(g.copies for g in t.groups) == [8, 16]  # 40 blocks on 24 cores: 16 run 2, 8 run 1
    assert t.pipe_totals()["cube"]["flops"] >= t.flops


def test_single_core_split_k_reads_each_slice_once_from_hbm():
    """k outer, the cores share one K slice at a time, so its A and B come from HBM about once: the long-K GEMM of
    catlass 34 (kernels.md K103) stays near its cube time with the split-K tiling."""
    b2 = load_chip("910b2")
    tiles = dict(dtype="fp16", out_dtype="fp16", layout_a="nz", layout_b="nz", base_m=128, base_n=128, base_k=128,
                 step_k=4)
    long_k = simulate(catalog.kernel("gemm", dict(m=4096, n=4096, k=40000, k_slice=512, **tiles)).trace(b2), b2,
                      launch="none")
    assert long_k.time < 1.35 * long_k.roofline
    assert long_k.hbm_bytes < 1.5 * (2 * 4096 * 40000 * 2 + 4096 * 4096 * 2)


def test_gemm_default_tiling_is_the_expert_one(chip):
    """Large GEMMs: pto-isa's 128x256x64 blocks, step_k 4, one L0C accumulator (published.md K20); decode GEMMs
    (m tiny): n dealt evenly over all cores so the weights stream from HBM on every core."""
    t = catalog.kernel("gemm", {"m": 4096, "n": 4096, "k": 4096}).trace(chip)
    assert {k: t.tiling[k] for k in ("base_m", "base_n", "base_k", "step_k", "l0c_depth")} == {
        "base_m": 128, "base_n": 256, "base_k": 64, "step_k": 4, "l0c_depth": 1}
    assert t.buffers["l0b"] == chip.aic.buffers.l0b and t.buffers["l0c"] == chip.aic.buffers.l0c
    d = catalog.kernel("gemm", {"m": 4, "n": 7168, "k": 2048}).trace(chip)
    assert d.tiling["base_m"] == 16 and d.tiling["blocks"] == chip.aic.count


def test_gemm_l2_reuse_follows_the_reread_operand(chip):
    """Walking along n, the A panel is fetched once per row of blocks and B (75 MB, fits L2) once in all."""
    k = catalog.kernel("gemm", {"m": 6144, "n": 6144, "k": 6144, "dtype": "fp16", "out_dtype": "fp32"})
    t = k.tiling(chip)
    assert t.by_row and t.l2_hits(chip, k.problem) == pytest.approx((1 - 1 / 24, 1 - 1 / 48))
    huge = catalog.kernel("gemm", {"m": 8192, "n": 131072, "k": 7168})  # B 1.9 GB: walk along m, re-read A
    ht = huge.tiling(chip)
    assert not ht.by_row and ht.l2_hits(chip, huge.problem)[0] == pytest.approx(1 - 1 / cdiv(131072, ht.base_n))


def test_overflowing_tiling_is_refused_saying_by_how_much(chip):
    kern = catalog.kernel("gemm", {"m": 512, "n": 512, "k": 512, "base_m": 256, "base_n": 256, "base_k": 256})
    with pytest.raises(NpusimError, match="too many"):
        kern.trace(chip)


def test_no_fp8_cube_on_910b(chip):
    with pytest.raises(NpusimError, match="no fp8"):
        catalog.kernel("gemm", {"m": 64, "n": 64, "k": 64, "dtype": "fp8"}).trace(chip)


def test_lightning_indexer_matches_huawei_block(chip):
    """The 950's FP8 Mat-Duce: 512 x 512 basic block, Q resident in L1 (64 KB) beside K triple-buffered in 256-key
    halves (96 KB), the fp16 S' chunks and block-diagonal head weights of the cube head reduction (models.md §3.4).
    INT8 on dav-c220, the QuantLightningIndexer's InitBuffers: 256 rows x 2048 keys, Q (32 KB) and W~ (8 KB)
    double-buffered, K in two 128-key slices (16 KB each), two S' chunks of 128 x 128 fp16 (32 KB each); L0B two K
    slices and two one-token S' pieces, L0C the two 64 KB buffers C1 and the head reduction share. bf16 on dav-c220:
    8 tokens x 64 heads, C1 only on the cube, its per-head fp32 scores weighted and reduced on the AIVs (ops-transformer
    arch22), so L1 holds Q and K alone and UB a 16-head group double-buffered."""
    p8 = catalog.kernel("lightning_indexer", {"tokens": 4096, "keys": 65536, "causal": 0, "dtype": "fp8"})
    t = p8.trace(load_chip("950pr"))
    assert t.tiling["block_m"] == 512 and t.tiling["block_n"] == 512
    c_m, c_n, _ = t.tiling["l0_chunk"]
    assert t.buffers["l1"] == 64 * 1024 + 96 * 1024 + 2 * 2 * c_m * c_n + 2 * 16 * 512
    assert t.tiling["head_reduction"] == "cube (Mat-Duce)"
    i8 = catalog.kernel("lightning_indexer", {"tokens": 4096, "keys": 65536, "causal": 0, "dtype": "int8"})
    t = i8.trace(chip)
    assert (t.tiling["block_m"], t.tiling["block_n"], t.tiling["l0_chunk"]) == (256, 2048, (128, 128, 128))
    assert t.buffers["l1"] == 2 * (32 + 8) * 1024 + 2 * 16 * 1024 + 2 * 32 * 1024
    assert (t.buffers["l0b"], t.buffers["l0c"]) == (64 * 1024, 128 * 1024)
    assert t.tiling["head_reduction"].startswith("cube per token")
    bf = catalog.kernel("lightning_indexer", {"tokens": 4096, "keys": 65536, "causal": 0}).trace(chip)
    assert bf.tiling["block_m"] == 512 and bf.tiling["head_reduction"].startswith("vector")
    assert bf.buffers["l1"] == 128 * 1024 + 192 * 1024
    assert bf.buffers["ub"] >= 2 * 16 * 512 * 4 + 4 * 2048 * 8
    ops = {i.op for _, i, _ in bf.instructions()}
    assert "head_scale" in ops and "mmad_heads" not in ops


def test_causal_indexer_cube_work_follows_the_triangle(chip):
    full = catalog.kernel("lightning_indexer", {"tokens": 8192, "keys": 8192, "causal": 0}).trace(chip)
    causal = catalog.kernel("lightning_indexer", {"tokens": 8192, "keys": 8192}).trace(chip)
    ratio = causal.pipe_totals()["cube"]["flops"] / full.pipe_totals()["cube"]["flops"]
    assert 0.5 < ratio < 0.55


def test_causal_indexer_prefill_is_one_loop_of_equal_units():
    """Query blocks qb and nq-1-qb share a unit, so the 128K causal triangle is one band the engine compresses."""
    chip = load_chip("910c-die")
    t = catalog.kernel("lightning_indexer", {"tokens": 131072, "keys": 131072}).trace(chip)
    assert t.tiling["units"] == "paired causal" and t.tiling["bands"] == 1
    assert Simulation(t, chip).run().events < 100_000


def test_indexer_pairs_query_blocks_only_where_the_causal_triangle_is_uneven():
    """Pairs qb with nq-1-qb to even out a causal triangle; with keys far beyond the queries (kernels.md K133: 512
    queries at the end of 4096 keys) every block sees the same tiles, and the blocks are dealt as SplitCore
    does."""
    from npusim.kernels.indexer import LightningIndexer

    chip = load_chip("910c-die")
    band = LightningIndexer(512, 4096, 32, 128, 1024, batch=1, dtype="fp16")
    triangle = LightningIndexer(8192, 8192, 32, 128, 1024, batch=1, dtype="fp16")
    assert not band.plan(chip).paired and triangle.plan(chip).paired


def test_indexer_splitcore_runs_are_contiguous_and_even():
    """dav-c220 SplitCore (kernels.md K135: 16 sequences x 6 key tiles over 20 cores): contiguous runs of 5 blocks
    on the first 16 cores and 4 on the last 4 (npusim's waves of whole query blocks ran 6), every block once; a
    query block cut between cores is merged after the SyncAll; K133 (A3, 910C die) within 15 % of its measured
    time."""
    from npusim.kernels.indexer import LightningIndexer

    b3 = load_chip("910b3")
    li = LightningIndexer(5, 3072, 64, 128, 2048, batch=16, dtype="fp16")
    runs = li.split_core(li.plan(b3), b3.aic.count)
    assert [sum(x.steps for x in r) for r in runs] == [5] * 16 + [4] * 4
    assert sorted((x.row, x.k0 + j) for r in runs for x in r for j in range(x.steps)) == [
        (row, k) for row in range(16) for k in range(6)]
    assert all(r[i + 1].row > r[i].row for r in runs for i in range(len(r) - 1))
    t = li.trace(b3)
    assert any(i.op == "sync_all" for _, i, _ in t.instructions()) and t.tiling["units"].startswith("SplitCore")
    a3 = load_chip("910c-die")
    k133 = LightningIndexer(512, 4096, 32, 128, 1024, batch=1, dtype="fp16")
    assert simulate(k133.trace(a3), a3, launch="device").time == pytest.approx(224.6e-6, rel=0.15)


def test_quantised_indexer_deals_one_sequence_per_block_over_the_cores():
    """The dav-c220 QuantLightningIndexer at A18's decode shape (2 sequences x 4 MTP3 tokens, 64K keys, a 910C die):
    one 256-row x 2048-key block per (sequence, key tile), the 64 blocks dealt 3 to the first 16 cores and 2 to the
    last 8, each sequence cut over the cores and merged by its first core after the SyncAll (isLD, ProcessLD); each
    AIV scores, sorts and merges its two tokens' 2048 keys every block, behind PipeBarriers (ProcessVec1)."""
    from npusim.kernels.indexer import DEQ_PASSES, LightningIndexer, sort_chain

    chip = load_chip("910c-die")
    li = LightningIndexer(4, 65536, 64, 128, 2048, batch=2, causal=0, dtype="int8")
    p = li.plan(chip)
    assert (p.tb, p.bn, p.c_m, p.c_n, p.nr, p.kmajor) == (4, 2048, 128, 128, 2, True)
    runs = li.split_core(p, chip.aic.count)
    assert [sum(x.steps for x in r) for r in runs] == [3] * 16 + [2] * 8
    assert [r[-1].row for r in runs if r[-1].part == 0 and not r[-1].whole] == [0, 1]
    t = li.trace(chip)
    assert t.tiling["units"] == "SplitCore: 64 blocks over 24 cores"
    issues = {i.op: i.issues for _, i, _ in t.instructions() if i.pipe == "vector"}
    assert (issues["scores"], issues["topk_merge"], sort_chain(2048)) == (DEQ_PASSES, 6, 6)
    assert sum(i.op == "load_k" for _, i, _ in t.instructions()) >= 16


def test_indexer_reads_a_paged_cache_page_by_page():
    """PA_BSND keys (kernels.md K138: 16-key blocks) come one DMA per page; the AIC's MTE2 issues them one after
    another (aic mte2 issue_cycles, from K138's raw profile), so small pages cost time where 128-key pages do not."""
    chip = load_chip("910b3")
    shape = {"tokens": 3, "keys": 512, "heads": 64, "topk": 315, "batch": 20, "causal": 0}
    flat, small, large = (catalog.kernel("lightning_indexer", shape | page).trace(chip)
                          for page in ({}, {"page": 16}, {"page": 128}))
    assert {i.issues for _, i, _ in small.instructions() if i.op == "load_k" and i.pipe == "mte2"} == {16}
    t_flat, t_small, t_large = (simulate(t, chip, launch="device").time for t in (flat, small, large))
    assert t_small > t_flat + 3e-6 and t_large < t_flat + 0.5e-6


def test_indexer_decode_splits_keys_over_the_cores():
    """A decode step (1 token per sequence, 2 sequences, 128K keys) cuts each sequence's keys into ranges on as many
    cores as keep HBM streaming (more ranges only lengthen the merge on one vector core), merges the ranges after a
    SyncAll, and runs within 2x of the HBM roofline (it ran on 2 cores at 64x before): dav-c220's AIVs weight and
    reduce each key's 64 per-head scores, sort and merge every 512-key block (one token: AIV0 only)."""
    chip = load_chip("910c-die")
    t = catalog.kernel("lightning_indexer", {"tokens": 1, "keys": 131072, "batch": 2, "causal": 0}).trace(chip)
    assert sum(g.copies for g in t.groups if g.aic is not None and g.aic.body) >= 8
    assert any(i.op == "sync_all" for _, i, _ in t.instructions())
    r = simulate(t, chip, launch="none")
    assert r.roofline_bound == "hbm" and r.time < 2.0 * r.roofline


def test_indexer_vector_cores_have_their_own_flags(chip):
    for shape in ({"tokens": 4096, "keys": 8192}, {"tokens": 4, "keys": 65536, "causal": 0}):
        for g in catalog.kernel("lightning_indexer", shape).trace(chip).groups:
            used = [{f for _, i, _ in _walked(p) for f in i.wait + i.set} for p in g.aiv]
            assert len(used) < 2 or not used[0] & used[1]


def _walked(prog):
    from npusim.kernels.trace import walk
    return ((prog, i, m) for i, m in walk(prog.body))


def test_indexer_quantised_variant_follows_the_op_dtype(chip):
    bf, i8 = (catalog.kernel("lightning_indexer", {"tokens": 2048, "keys": 8192, "dtype": d}).trace(chip)
              for d in ("bf16", "int8"))
    assert i8.dtype == "int8" and i8.buffers["l1"] < bf.buffers["l1"]
    assert any(i.op == "load_key_scales" for _, i, _ in i8.instructions())
    assert not any(i.op == "load_key_scales" for _, i, _ in bf.instructions())


def test_indexer_buffering_is_the_depth_of_its_double_buffered_queues():
    """A plan's buffering reaches the indexer as the depth of its double-buffered queues (the L0 chunks, the UB
    scores and the two K slices here, the INT8 QuantLightningIndexer): the score workspace keeps its two named slots
    and S' in L1 its two buffers (C1 of a chunk runs before the head reduction of the one before); buffer use
    follows the depth, and single buffering is never faster."""
    from npusim.parallel.optime import kernel_trace

    chip = load_chip("910c-die")
    k = catalog.kernel("lightning_indexer", {"tokens": 8, "keys": 4096, "topk": 512, "causal": 0, "dtype": "int8"})
    single, double = kernel_trace(k, chip, 1), kernel_trace(k, chip, 0)
    depth = lambda t, f: t.groups[0].flags[f]  # noqa: E731
    assert [depth(single, f) for f in ("kb.free", "s1.free", "ub.free0", "k.free", "ws0.free0")] == [1, 2, 1, 1, 1]
    assert [depth(double, f) for f in ("kb.free", "s1.free", "ub.free0", "k.free", "ws0.free0")] == [2, 2, 2, 2, 1]
    assert single.buffers["l0b"] == double.buffers["l0b"] / 2 and single.tiling["buffering"] == 1
    assert simulate(single, chip).time >= simulate(double, chip).time


def test_every_trace_has_a_flag_order_the_executor_accepts(chip):
    t = catalog.kernel("gemm", {"m": 40, "n": 40, "k": 40}).trace(chip)
    assert sum(1 for g in t.groups for p in g.programs for _ in unroll(p.body)) > 0


def test_unknown_kernel_and_shape_key_are_plain_errors():
    with pytest.raises(NpusimError, match="did you mean"):
        catalog.kernel("gem", {})
    with pytest.raises(NpusimError, match="no shape key"):
        catalog.kernel("gemm", {"m": 1, "n": 1, "k": 1, "q": 3})


def test_grouped_gemm_band_per_expert(chip):
    even = catalog.kernel("grouped_gemm", {"rows": 4096, "k": 7168, "n": 4096, "experts": 32}).trace(chip)
    tl = even.tiling
    assert tl["experts"] == 32 and tl["blocks"] == 32 * cdiv(128, tl["base_m"]) * cdiv(4096, tl["base_n"])
    skew = catalog.kernel("grouped_gemm", {"rows": 300, "k": 512, "n": 256, "experts": 3, "counts": "0,290,10"}
                          ).trace(chip)
    assert skew.tiling["experts"] == 2  # the idle expert costs nothing
    assert skew.pipe_totals()["cube"]["flops"] >= skew.flops
    with pytest.raises(NpusimError, match="summing to rows"):
        catalog.kernel("grouped_gemm", {"rows": 300, "k": 512, "n": 256, "experts": 3, "counts": "1,2,3"}).trace(chip)
