"""A bulk prefill's MoE as cann-recipes runs it (R1 prefill, "double routing"): init_routing, the dispatch
all-to-all, re_routing, the experts, the un-sort, the combine all-to-all, finalize_routing (moe_combine); its
all-to-alls are bulk kernels with their own efficiency and per-peer cost, fitted on K07."""

import dataclasses

import pytest

from npusim.errors import NpusimError
from npusim.parallel.collectives import Collective, collective_time
from npusim.engine.streams import Task
from npusim.parallel.shard import shard
from npusim.parallel.step import _interleave
from npusim.spec.model import load_model
from npusim.spec.plan import load_plan
from npusim.spec.quant import get_quant
from npusim.spec.system import load_system

R1, W8A8 = load_model("deepseek-v3.1"), get_quant("w8a8")
A15 = load_plan("r1-a3-prefill-a15")  # 32 ranks, DP32 + EP32


def _moe_layer(plan, phase="prefill", batch=64, length=4096):
    step = shard(R1, plan, phase, batch=batch, length=length, quant=W8A8)
    return next(layer for layer in step.layers if layer.name == "mla-moe")


def test_double_routing_passes_are_in_the_prefill_graph_around_the_all_to_alls():
    layer = _moe_layer(A15)
    names = [o.name for o in layer.ops]
    order = ["moe_gate", "moe_init_routing", "moe_re_routing", "experts_gate_up", "experts_down", "moe_unsort",
             "moe_combine"]
    assert [n for n in names if n in order] == order
    comms = {c.name: (c.after, c.before) for c in layer.comms}
    assert comms["moe_dispatch"] == ("moe_init_routing", "moe_re_routing")
    assert comms["moe_combine_all_to_all"] == ("moe_unsort", "moe_combine")
    ops = {o.name: o for o in layer.ops}
    rows, h = 8192 * 8, 7168  # two 4K prompts per rank, top-8
    init, rerouting, unsort = ops["moe_init_routing"], ops["moe_re_routing"], ops["moe_unsort"]
    assert init.shape == rerouting.shape == unsort.shape == {"rows": rows, "hidden": h}
    # one pass each: init reads BF16 and writes INT8 rows (quant_mode 1), re-routing moves INT8, the un-sort BF16
    int8 = W8A8.activation.bytes_for(rows * h)
    assert (init.bytes_read, init.bytes_written) == (2 * rows * h, pytest.approx(int8))
    assert (rerouting.bytes_read, rerouting.bytes_written) == (pytest.approx(int8), pytest.approx(int8))
    assert (unsort.bytes_read, unsort.bytes_written) == (2 * rows * h, 2 * rows * h)
    assert all(c.collective.bulk for c in layer.comms if c.name.startswith("moe_"))


def test_split_exchanges_send_the_counts_before_the_rows_and_the_scales_after():
    """cann-recipes' dispatch_double_routing: an all_to_all_single of the int32 tokens-per-expert (their splits), the
    INT8 rows, then their fp32 scales, all between init_routing and re_routing and all bulk HCCL all-to-alls; a BF16
    dispatch has no scales, a plan without model_code.split_exchanges neither exchange."""
    layer = _moe_layer(A15)
    exchanges = [c for c in layer.comms if c.after == "moe_init_routing"]
    assert [c.name for c in exchanges] == ["moe_count_all_to_all", "moe_dispatch", "moe_scale_all_to_all"]
    assert all(c.before == "moe_re_routing" and c.collective.bulk and c.collective.group == 32 for c in exchanges)
    counts, rows, scales = (c.collective.bytes for c in exchanges)
    assert counts == 4 * R1.n_routed_experts and scales == 4 * 8192 * 8
    assert rows == pytest.approx(W8A8.activation.bytes_for(8192 * 8 * 7168), rel=0.02)
    bf16 = shard(R1, A15, "prefill", batch=64, length=4096, quant=get_quant("bf16"))
    names = {c.name for lg in bf16.layers for c in lg.comms}
    assert "moe_count_all_to_all" in names and "moe_scale_all_to_all" not in names
    plain = load_plan("r1-a3-prefill-a15", {"model_code.split_exchanges": "false"})
    assert not {"moe_count_all_to_all", "moe_scale_all_to_all"} & {c.name for c in _moe_layer(plain).comms}


def test_back_to_back_exchanges_are_one_boundary_of_the_two_microbatch_order():
    """The counts, rows and scales of one dispatch call go out together: in the two-microbatch order mb0's three
    exchanges precede mb1's on the comm stream (were they three boundaries, mb0's rows would queue behind mb1's
    counts, which wait for mb1's attention), and mb1's attention runs before mb0's experts."""
    def task(m, n):
        comm = n.startswith("x_")
        return Task(f"mb{m}.{n}", "comm" if comm else "compute", 1.0, category="comm" if comm else "compute")
    tasks = [task(m, n) for m in (0, 1) for n in ("attn", "x_count", "x_rows", "x_scales", "experts", "x_combine")]
    order = [t.name for t in _interleave(tasks, 2)]
    assert order.index("mb0.x_scales") < order.index("mb1.x_count")
    assert order.index("mb0.x_count") < order.index("mb1.attn") < order.index("mb0.experts")


def test_decode_and_a_lone_die_route_without_the_bulk_passes():
    decode = _moe_layer(load_plan("r1-a3-decode-a16"), "decode", batch=6144)
    assert not {"moe_init_routing", "moe_re_routing", "moe_unsort"} & {o.name for o in decode.ops}
    assert not any(c.collective.bulk for c in decode.comms)
    alone = load_plan("r1-a3-prefill-a15", {"prefill.ranks": "1", "prefill.attention.dp": "1", "prefill.moe.ep": "1"})
    names = {o.name for o in _moe_layer(alone, batch=1).ops}
    assert "moe_init_routing" in names and not {"moe_re_routing", "moe_unsort"} & names


def test_a_prefill_whose_tokens_fit_the_fused_dispatch_routes_as_decode_does():
    """vllm-ascend's choice on A3: MC2 up to its token capacity (512 per die by default), the bulk all-to-all above."""
    routing = {"moe_init_routing", "moe_re_routing", "moe_unsort"}
    small = _moe_layer(A15, batch=32, length=512)  # 512 tokens per die
    assert not routing & {o.name for o in small.ops} and not any(c.collective.bulk for c in small.comms)
    assert routing <= {o.name for o in _moe_layer(A15, batch=32, length=513).ops}
    always = load_plan("r1-a3-prefill-a15", {"prefill.moe.fused_dispatch_tokens": "0"})
    assert all(c.collective.bulk for c in _moe_layer(always, batch=32, length=512).comms if c.name.startswith("moe_"))


def test_a_bulk_all_to_all_pays_its_efficiency_and_a_cost_per_peer():
    cm = load_system("cloudmatrix384")
    chip = cm.chip_spec
    size = 4096 * 8 * 7168
    for group in (8, 64):
        fused, bulk = (collective_time(Collective("all_to_all", size, group, bulk=b), cm).time for b in (False, True))
        assert bulk > fused
    free = dataclasses.replace(cm, chip_spec=dataclasses.replace(
        chip, overheads=dataclasses.replace(chip.overheads, all_to_all_peer=0.0)))
    extra = [collective_time(Collective("all_to_all", size, g, bulk=True), cm).time -
             collective_time(Collective("all_to_all", size, g, bulk=True), free).time for g in (8, 64)]
    assert extra == pytest.approx([7 * chip.overheads.all_to_all_peer, 63 * chip.overheads.all_to_all_peer])
    with pytest.raises(NpusimError, match="only an all-to-all"):
        Collective("all_gather", size, 8, bulk=True)


def test_k07_is_met_by_the_bulk_all_to_all_fit():
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "experiments"))
    from comm_validation import table

    frame = table()
    k07 = frame[frame.id == "K07"]
    assert len(k07) == 10 and (k07.use == "fit").all() and (k07["error %"].abs() <= 15).all()
