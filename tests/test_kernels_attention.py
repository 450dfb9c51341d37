"""Attention tilings: Huawei's SFA blocks, buffer fit, compressed 128K traces, shapes from the op graph."""

import pytest

from npusim.errors import NpusimError
from npusim.kernels import catalog
from npusim.kernels.trace import Loop
from npusim.spec.chip import load_chip


@pytest.fixture(scope="module")
def chip():
    return load_chip("910c-die")


def test_sfa_matches_huawei_blocks(chip):
    t = catalog.kernel("sparse_flash_attention", {"tokens": 64, "keys": 65536}).trace(chip)
    assert t.tiling["block"] == (128, 512)  # one token's 128 heads (mBaseSize = gSize) by 512 selected keys
    assert t.tiling["l0_c1"] == ((128, 96), (96, 128)) and t.tiling["l0_c2"] == ((128, 128), (128, 128))
    kv_ring = 3 * 128 * 288 * 2
    assert t.buffers["l1"] == 128 * 576 * 2 + 128 * 512 * 2 + kv_ring  # Q + P (the 4 x 128x288 Q/P slots) + K/V
    assert t.buffers["l1"] <= chip.aic.buffers.l1


def test_sfa_decode_tokens_spread_over_cores(chip):
    """Each token gathers its own top-k rows, so the kernel deals a token per block over the AICs: two decode tokens
    take two cores and about the time of one (a block of two tokens would run them one after the other)."""
    from npusim.engine.result import simulate
    shape = {"keys": 131072, "causal": 0}
    one, two = (catalog.kernel("sparse_flash_attention", {**shape, "tokens": n}).trace(chip) for n in (1, 2))
    assert two.cores["aic"] == 2
    assert simulate(two, chip).time == pytest.approx(simulate(one, chip).time, rel=0.05)


def test_sfa_cube_work_and_gathers(chip):
    t = catalog.kernel("sparse_flash_attention", {"tokens": 64, "keys": 131072}).trace(chip)
    pipes = t.pipe_totals()
    assert pipes["cube"]["flops"] == pytest.approx(t.flops)  # 2048 = 4 full tiles: no padding waste
    gathered = sum(i.bytes * m for _, i, m in t.instructions() if i.op == "gather")
    assert gathered == pytest.approx(64 * 2048 * (576 * 2 + 4))  # every selected row moved by the vector cores
    assert t.cores["aiv"] == 2 * t.cores["aic"]


def test_op_graph_shapes_build(chip):
    shapes = {
        "sparse_flash_attention": {"tokens": 32, "heads": 128, "d_qk": 576, "d_v": 512, "keys": 8192, "topk": 2048,
                                   "pairs": 32 * 2048},
        "flash_attention": {"tokens": 4096, "heads": 128, "d_qk": 192, "d_v": 128, "keys": 4096, "pairs": 8390656,
                            "kv_heads": 128},
        "v4_attention": {"tokens": 8, "heads": 64, "head_dim": 512, "window": 128, "ratio": 4, "topk": 512,
                         "pairs": 8 * 640, "sink": 1, "keys": 65536},
    }
    for name, shape in shapes.items():
        t = catalog.kernel(name, shape).trace(chip)
        assert t.pipe_totals()["cube"]["flops"] >= t.flops


@pytest.mark.parametrize("name,shape", [
    ("sparse_flash_attention", {"tokens": 131072, "keys": 131072}),
    ("flash_attention", {"tokens": 131072, "keys": 131072, "heads": 128, "kv_heads": 128}),
    ("v4_attention", {"tokens": 131072, "keys": 131072, "ratio": 128}),
])
def test_128k_traces_stay_compact(chip, name, shape):
    """Loops stay loops: a 128K trace writes orders of magnitude fewer instructions than it runs (its build time is
    in benchmarks/kernel_trace_build.py)."""
    t = catalog.kernel(name, shape).trace(chip)
    written = sum(1 for _ in t.instructions())
    run = sum(p["instructions"] for p in t.pipe_totals().values())
    assert run > 1e7 and written < 1e6 and run > 20 * written


def test_causal_dense_work_follows_the_triangle(chip):
    full = catalog.kernel("flash_attention", {"tokens": 8192, "keys": 8192, "kv_heads": 128, "causal": 0}).trace(chip)
    causal = catalog.kernel("flash_attention", {"tokens": 8192, "keys": 8192, "kv_heads": 128}).trace(chip)
    assert 0.5 < causal.pipe_totals()["cube"]["flops"] / full.pipe_totals()["cube"]["flops"] < 0.55


def test_bad_blocks_are_plain_errors(chip):
    with pytest.raises(NpusimError, match="block_n"):
        catalog.kernel("sparse_flash_attention", {"tokens": 4, "keys": 4096, "block_n": 300}).trace(chip)
    with pytest.raises(NpusimError, match="too many"):
        catalog.kernel("sparse_flash_attention", {"tokens": 4, "keys": 4096, "block_m": 512, "heads": 256}
                       ).trace(chip)


@pytest.mark.parametrize("name,shape", [
    ("sparse_flash_attention", {"tokens": 2, "keys": 131072, "causal": 0, "kv_splits": 0}),
    ("v4_attention", {"tokens": 2, "keys": 131072, "ratio": 128}),
    ("flash_attention", {"tokens": 2, "keys": 32768, "heads": 128, "d_qk": 576, "d_v": 512, "causal": 0}),
])
def test_decode_splits_keys_over_all_cores(chip, name, shape):
    t = catalog.kernel(name, shape).trace(chip)
    assert t.tiling["kv_splits"] > 1 and t.cores["aic"] == chip.aic.count
    assert any(i.op == "sync_all" for _, i, _ in t.instructions())  # one barrier before the combine
    single = catalog.kernel(name, shape | {"kv_splits": 1}).trace(chip)
    assert single.tiling["kv_splits"] == 1 and single.cores["aic"] < chip.aic.count


def test_sfa_decode_runs_as_the_measured_kernel_one_core_per_token_block(chip):
    """The AscendC SFA never splits keys (its tiling's splitKVFlag_ stays false): one token's heads and all its
    selected keys are one core's work, so a single-token decode uses one core (kernels.md K142-K144: flat ~98 us)."""
    t = catalog.kernel("sparse_flash_attention", {"tokens": 1, "keys": 48000, "causal": 0}).trace(chip)
    assert t.tiling["kv_splits"] == 1 and t.cores["aic"] == 1 and t.tiling["row_group"] == 128


def test_split_kv_is_faster_at_decode(chip):
    from npusim.engine import simulate
    shape = {"tokens": 2, "keys": 131072, "causal": 0, "kv_splits": 0}
    split = simulate(catalog.kernel("sparse_flash_attention", shape).trace(chip), chip, launch="none")
    single = simulate(catalog.kernel("sparse_flash_attention", shape | {"kv_splits": 1}).trace(chip), chip,
                      launch="none")
    assert split.time < 0.6 * single.time
    assert split.time >= split.roofline


def _cube_flops(nodes) -> float:
    return sum(n.count * _cube_flops(n.body) if isinstance(n, Loop) else n.flops * (n.pipe == "cube") for n in nodes)


def test_causal_ramp_is_dealt_in_units_of_a_full_block(chip):
    """Ramp blocks of k and 4 - k key tiles (tokens with fewer than top-k keys) are paired into units of one full
    block's work: every core gets the same ramp work (32 units: 512 of 1 + 3 tiles and 256 of 2 + 2 over 24 cores),
    so the cores reach the full band together and fold into two groups, not one per leftover pattern."""
    t = catalog.kernel("sparse_flash_attention", {"tokens": 131072, "keys": 131072}).trace(chip)
    loops = [[n for n in g.aic.body if isinstance(n, Loop)] for g in t.groups]
    assert len(t.groups) == 2 and t.tiling["bands"] == 3
    assert {sum(loop.count for loop in ls[:-1]) for ls in loops} == {32}
    full = _cube_flops(loops[0][-1].body)
    assert all(_cube_flops(loop.body) == pytest.approx(full) for ls in loops for loop in ls)
    # every one-token block dealt once: two per unit, one per full-band iteration
    assert sum(g.copies * (2 * sum(lp.count for lp in ls[:-1]) + ls[-1].count) for g, ls in zip(t.groups, loops)) \
        == 131072


def test_prefill_keeps_one_key_range(chip):
    t = catalog.kernel("sparse_flash_attention", {"tokens": 4096, "keys": 4096}).trace(chip)
    assert t.tiling["kv_splits"] == 1


def test_preload_runs_across_token_boundaries(chip):
    """In a block of two tokens (block_m 256) the next token's Q and first C1 are issued before this token's last C2
    (the cube does not drain per token)."""
    from npusim.kernels.trace import unroll
    t = catalog.kernel("sparse_flash_attention", {"tokens": 2, "keys": 4096, "kv_splits": 1, "block_m": 256}).trace(chip)
    ops = [i.op for i, _ in unroll(t.groups[0].aic.body)]
    second_q = [k for k, op in enumerate(ops) if op == "load_q"][1]
    assert second_q < max(k for k, op in enumerate(ops) if op == "store_o") - 2 * 4  # 4 C2 row/column stores
    assert "store_s" in ops[second_q:second_q + 60]


def test_v4_is_laid_out_as_the_sas_metadata_deals_it(chip):
    """A V4 row group is one token's 64 heads (the SAS's mBaseSize = gSize) and a block a core's contiguous share of
    the tokens (8192 / 24 cores -> 342 tokens); a single-token decode keeps the token's heads together (the SAS
    metadata splits key ranges, never heads)."""
    t = catalog.kernel("v4_attention", {"tokens": 8192, "keys": 8192, "ratio": 128}).trace(chip)
    assert t.tiling["row_group"] == 64 and t.tiling["block"][0] == 64 * 342
    assert t.cores["aic"] == chip.aic.count  # 24 blocks in one wave: no ramp units of two blocks on a core
    decode = catalog.kernel("v4_attention", {"tokens": 1, "keys": 8193, "ratio": 4, "topk": 512}).trace(chip)
    assert decode.tiling["row_group"] == 64


MLA = {"heads": 128, "d_qk": 576, "d_v": 512, "kv_heads": 1, "causal": 0}  # absorbed MLA decode (R1)


def _hbm_reads(t, op: str) -> float:
    """Bytes the launch's `op` instructions read from HBM (what L2 does not serve)."""
    return sum(i.bytes * m * (1 - i.hit) for _, i, m in t.instructions() if i.op == op)


def test_dense_mla_decode_reads_each_sequences_latent(chip):
    """A batched dense MLA decode launch deals (sequence, token) blocks, each walking its own sequence's latent rows:
    four sequences of two tokens read four latents where eight tokens of one sequence read one (ops-transformer
    incre_flash_attention SplitBN / SplitBalanced units over batch x heads)."""
    shape = {**MLA, "keys": 4096}
    one = catalog.kernel("flash_attention", {**shape, "tokens": 8, "batch": 1}).trace(chip)
    four = catalog.kernel("flash_attention", {**shape, "tokens": 2, "batch": 4}).trace(chip)
    assert four.hbm_bytes > 3.5 * (one.hbm_bytes - 8 * 128 * 576 * 2)
    assert _hbm_reads(four, "load_k") > 3 * _hbm_reads(one, "load_k")


def test_mla_values_are_the_latent_rows_just_read(chip):
    """Absorbed MLA passes its latent cache as both key and value: a V chunk re-reads rows C1 has just loaded, so
    it comes from L2; a GQA kernel's V is its own array and its reads reach HBM when the keys do not fit L2."""
    mla = catalog.kernel("flash_attention", {**MLA, "keys": 4096, "tokens": 2, "batch": 48}).trace(chip)
    assert _hbm_reads(mla, "load_v") == 0 and _hbm_reads(mla, "load_k") > 0
    gqa = catalog.kernel("flash_attention", {"heads": 64, "kv_heads": 8, "d_qk": 128, "d_v": 128, "causal": 0,
                                             "keys": 131072, "tokens": 1, "batch": 48}).trace(chip)
    assert _hbm_reads(gqa, "load_v") > 0
