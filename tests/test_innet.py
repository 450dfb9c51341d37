"""In-network kernels (issue 14 item 3): inside a step a kernel reads its predecessor's output from L2 when the
predecessor's footprint fits L2 and starts cold when it touched more; collectives beside kernels hold AIV cores and
share HBM, so a layer is never faster with them than without."""

import dataclasses

import pytest

from npusim.api import load_setup
from npusim.engine.l2state import carried
from npusim.parallel.optime import OpRun, op_time
from npusim.parallel.shard import shard
from npusim.parallel.step import layer_time
from npusim.spec.plan import Streams

A16 = dict(hw="cloudmatrix384", model="deepseek-v3.1", plan="r1-a3-decode-a16", quant="w8a8c8")


@pytest.fixture(scope="module")
def setup():
    return load_setup(**A16)


def _moe_layer(setup, phase, **size):
    step = shard(setup.model, setup.plan, phase, quant=setup.quant, **size)
    return next(lay for lay in step.layers if lay.name == "mla-moe")


@pytest.fixture(scope="module")
def layer(setup):
    return _moe_layer(setup, "decode", batch=6144, length=4096)


def test_a_kernel_after_one_that_touched_more_than_l2_starts_cold(setup):
    """An 8K-token prefill layer: q_b_proj / kv_b_proj / the experts move more than the 192 MiB L2, the norms less."""
    chip = setup.system.chip_spec
    layer = _moe_layer(setup, "prefill", batch=1, length=8192)
    lt = layer_time(layer, setup.plan, setup.system, Streams())  # one stream, no fusion of the ops below
    times = {t.op: t for t in lt.ops}
    ops = [o for o in layer.ops if o.name in times]
    cold_after, warm_after = [], []
    for before, op in zip(ops, ops[1:]):
        cold = op_time(op, chip, OpRun("graph")).time
        (warm_after if carried(times[before.name].activity.hbm_bytes, chip) else cold_after).append(
            (op.name, times[op.name].time, cold))
    assert cold_after and warm_after
    assert all(t == cold for _, t, cold in cold_after)  # evicted: exactly the cold launch
    assert all(t <= cold for _, t, cold in warm_after)  # resident input: never slower than cold
    assert any(t < cold for _, t, cold in warm_after)
    assert not carried(chip.l2.size + 1, chip) and carried(chip.l2.size, chip)


def test_collectives_beside_kernels_never_make_a_layer_faster(setup, layer):
    """Two microbatches: one's dispatch / combine (MC2, every AIV held) runs beside the other's kernels."""
    two = Streams(two_microbatch=True, shared_expert_side_stream=True)
    system = setup.system
    bare = dataclasses.replace(system, chip_spec=dataclasses.replace(system.chip_spec, comm=None))
    shared = layer_time(layer, setup.plan, system, two)
    alone = layer_time(layer, setup.plan, bare, two)
    assert shared.time >= alone.time
    stretched = [s for s in shared.timeline.spans if s.task.category == "compute"
                 and s.end - s.start > s.task.duration * (1 + 1e-9)]
    assert stretched  # some kernel ran beside a collective and took longer than alone
    assert all(s.end - s.start >= s.task.duration * (1 - 1e-9) for s in shared.timeline.spans)
