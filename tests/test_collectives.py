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
