"""Collective timing: HCCL's node-local paths (AIV kernel up to the entry size, AI CPU ring above), the reduce pass
of a reduce-scatter, and the generic tier model where HCCL does not apply."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from npusim.parallel.collectives import Collective, collective_time
from npusim.spec.system import load_system

A3 = load_system("atlas-800-a3")
KIB = 1024


def t(kind, per_rank, group, system=A3, **kw):
    size = per_rank if kind == "all_reduce" else per_rank * group
    return collective_time(Collective(kind, size, group, **kw), system)


def test_small_all_gather_costs_the_aiv_setup_and_one_latency():
    r = t("all_gather", 1 * KIB, 8)
    h, ub = A3.hccl, A3.tiers["ub"]
    assert r.algorithm == "hccl-aiv"
    assert r.time == pytest.approx(h.aiv_setup + ub.latency, rel=0.02)


def test_all_gather_steps_up_where_the_aiv_entry_ends():
    entry = A3.hccl.aiv_entry["all_gather"]
    below, above = t("all_gather", entry, 8), t("all_gather", entry + KIB, 8)
    assert below.algorithm == "hccl-aiv" and above.algorithm == "hccl-aicpu-ring"
    assert above.time > 2 * below.time  # the ring's start and its steps, not the one extra KiB


def test_reduce_scatter_adds_the_reduction_pass_through_hbm():
    ag, rs = t("all_gather", 8 << 20, 16), t("reduce_scatter", 8 << 20, 16)
    chip = A3.chip_spec
    assert rs.time - ag.time == pytest.approx(16 * (8 << 20) / (chip.hbm.bandwidth * chip.efficiency.hbm))


def test_all_reduce_is_a_reduce_scatter_and_an_all_gather():
    ar = t("all_reduce", 256 * KIB, 8)
    rs, ag = t("reduce_scatter", 32 * KIB, 8), t("all_gather", 32 * KIB, 8)
    assert ar.time == pytest.approx(rs.time + ag.time - A3.hccl.aiv_setup)


def test_hccl_model_is_node_local_and_leaves_other_kinds_alone():
    cm = load_system("cloudmatrix384")
    across = t("all_gather", 64 * KIB, 32, system=cm)  # 32 dies span two nodes
    assert not across.algorithm.startswith("hccl")
    a2a = collective_time(Collective("all_to_all", 1 << 20, 8), A3)
    assert a2a.time >= A3.tiers["ub"].setup  # all-to-all keeps its tier setup (MoE dispatch fit)
    assert load_system("atlas-800-a2").hccl is None


def test_plain_hccl_all_to_all_takes_the_aiv_kernel_up_to_its_entry_and_moe_dispatch_keeps_its_setup():
    """A plain HCCL AlltoAll in a node (o_proj's head exchange) is one AIV kernel while each peer's data fits
    AIV_ALL_TO_ALL_A3_ENTRY_SIZE, the AI CPU ring above it; the fused MoE dispatch of the same bytes keeps the UB
    setup fitted on K01/K08."""
    entry = A3.hccl.aiv_entry["all_to_all"]
    small = t("all_to_all", 16 * KIB, 8, hccl=True)
    assert small.algorithm == "hccl-aiv"
    assert small.time == pytest.approx(A3.hccl.aiv_setup + A3.tiers["ub"].latency, rel=0.1)
    below, above = t("all_to_all", entry, 8, hccl=True), t("all_to_all", entry + KIB, 8, hccl=True)
    assert below.algorithm == "hccl-aiv" and above.algorithm == "hccl-aicpu-ring" and above.time > below.time
    moe = t("all_to_all", 16 * KIB, 8)
    assert not moe.algorithm.startswith("hccl") and moe.time > A3.tiers["ub"].setup > 5 * small.time


def test_only_a_non_bulk_all_to_all_is_marked_hccl():
    from npusim.errors import NpusimError
    for kw in ({"kind": "all_gather", "hccl": True}, {"kind": "all_to_all", "hccl": True, "bulk": True}):
        with pytest.raises(NpusimError, match="plain HCCL"):
            Collective(bytes=1.0, group=4, **kw)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["all_gather", "reduce_scatter", "all_reduce"]), st.integers(1, 64 << 20),
       st.sampled_from([2, 4, 8, 16]))
def test_more_link_bandwidth_never_slows_a_collective(kind, size, group):
    tiers = {n: dataclasses.replace(tr, bandwidth=2 * tr.bandwidth) for n, tr in A3.tiers.items()}
    fast = dataclasses.replace(A3, tiers=tiers)
    assert t(kind, size, group, system=fast).time <= t(kind, size, group).time


# ------------------------------------------------------------------------------- fused MoE dispatch / combine rows
CM384 = load_system("cloudmatrix384")
LOW_LATENCY = 128 * 8 * 7168  # published.md K08: 128 tokens x top-8 x hidden 7,168, one byte per element (INT8)


def fused(size, group, rows, system=CM384, **kw):
    return collective_time(Collective("all_to_all", size, group, rows=rows, **kw), system).time * 1e6


@pytest.mark.parametrize("ep, dispatch_us, combine_us", [(8, 132, 126), (16, 139, 135), (32, 153, 151)])
def test_low_latency_dispatch_costs_its_rows_like_the_combine(ep, dispatch_us, combine_us):
    """K08: the INT8 dispatch takes as long as the BF16 combine though it moves half the bytes: both are bound by
    the (token, expert) rows their AIVs write one at a time. Without rows the dispatch was 29-34 % short."""
    d, c = fused(LOW_LATENCY, ep, 1024), fused(2 * LOW_LATENCY, ep, 1024)
    assert abs(d - c) / c < 0.05
    assert d == pytest.approx(dispatch_us, rel=0.18) and c == pytest.approx(combine_us, rel=0.15)
    assert d > 1.2 * fused(LOW_LATENCY, ep, 0)


def test_row_term_grows_with_rows_per_aiv_and_vanishes_at_a_few_rows():
    """The busiest AIV's rows: half the AIVs (32 -> 64 rows each) double the row term; eight tokens' rows leave
    the bytes-and-latency exchange as it was."""
    full, half = fused(LOW_LATENCY, 16, 1024, issuers=32), fused(LOW_LATENCY, 16, 1024, issuers=16)
    setup = CM384.tiers["ub"].setup * 1e6
    assert half - setup == pytest.approx(2 * (full - setup), rel=0.01)
    small = 8 * 8 * 7168
    assert fused(small, 16, 64) == pytest.approx(fused(small, 16, 0), rel=0.1)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 4096), st.sampled_from([2, 8, 16, 32, 128]), st.integers(1, 2))
def test_counting_rows_never_makes_the_fused_exchange_faster_than_its_bytes_allow(tokens, group, elem):
    """With rows the time is at least the row bound and at least the buffer exchange at the AIV-direct rate."""
    rows, size = tokens * 8, tokens * 8 * 7168 * elem
    with_rows = fused(size, group, rows)
    _, tier = CM384.tier_for(group)
    assert with_rows >= tier.setup * 1e6 + tier.latency * 1e6 * (rows // 48)
    assert with_rows >= fused(size, group, 0) * (CM384.chip_spec.efficiency.link / CM384.hccl.efficiency) - 1e-6


def test_only_a_fused_moe_all_to_all_counts_rows():
    from npusim.errors import NpusimError
    for kw in ({"kind": "all_gather"}, {"kind": "all_to_all", "bulk": True}, {"kind": "all_to_all", "hccl": True}):
        with pytest.raises(NpusimError, match="counted rows"):
            Collective(bytes=1.0, group=4, rows=8, **kw)
