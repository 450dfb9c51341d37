"""HBM per rank (npusim.parallel.memory) against what the rank runs (npusim.parallel.shard): the weights a rank stores
are those its ops read, split over the degrees that split the ops."""

import pytest

from npusim.parallel.memory import weight_bytes
from npusim.parallel.shard import ROUTED, shard
from npusim.spec.model import load_model
from npusim.spec.plan import load_plan
from npusim.spec.quant import get_quant


def _decode(tp: int):
    """A 32-rank decode instance at attention TP `tp` (o_proj's group fixed at 4), no MTP layer."""
    return load_plan("v32-a3-sglang-pd-tp4", {"decode.attention.tp": str(tp), "decode.attention.dp": str(32 // tp),
                                              "decode.o_proj_tp": "4", "mtp.depth": "0", "mtp.acceptance": "0"})


def _ops_weights(model, plan, quant) -> float:
    """Weight bytes of one decode step's ops on the rank, the routed experts apart (theirs are the touched experts)."""
    step = shard(model, plan, "decode", batch=64, length=4096, quant=quant)
    return sum(layer.repeat * sum(o.weight_bytes for o in layer.ops if o.name not in ROUTED) for layer in step.layers)


@pytest.mark.parametrize("model, quant", [("deepseek-v3.2-exp", "w8a8c8"), ("deepseek-v3.1", "w8a8"),
                                          ("deepseek-v3.2-exp", "bf16")])
def test_attention_tp_splits_the_stored_weights_as_it_splits_the_ops(model, quant):
    """From attention TP1 to TP4 a rank stores less of exactly the weights its ops stop reading: q_b and kv_b's
    halves by heads. MLA's q_a_proj / kv_a_proj_with_mqa stay whole at both (ReplicatedLinear in the deployments),
    whether BF16 (V3.2's 'mla_a') or INT8 with the rest of attention (R1's conversion)."""
    m, q = load_model(model), get_quant(quant)
    stored = weight_bytes(m, _decode(1), "decode", q) - weight_bytes(m, _decode(4), "decode", q)
    run = _ops_weights(m, _decode(1), q) - _ops_weights(m, _decode(4), q)
    assert stored == pytest.approx(run, rel=1e-3)  # the norms' few KiB apart


@pytest.mark.parametrize("model, quant", [("deepseek-v3.2-exp", "w8a8c8"), ("deepseek-v3.1", "w8a8c8"),
                                          ("deepseek-v3.2-exp", "w4a8c8")])
def test_the_mtp_layer_is_stored_as_one_more_decoder_layer(model, quant):
    """The deployments' conversions quantise the MTP layer as any decoder layer (one ignore list over every layer
    index) and keep its eh_proj BF16: with a depth, a rank stores one more MoE layer's share of each class (the model
    with a 62nd layer), plus eh_proj [2h, h] and three norms in BF16."""
    q = get_quant(quant)
    base, longer = load_model(model), load_model(model, {"num_hidden_layers": "62"})
    plan = load_plan("v32-a3-decode-w8a8c8-mtp3")
    flat = load_plan("v32-a3-decode-w8a8c8-mtp3", {"mtp.depth": "0", "mtp.acceptance": "0"})
    mtp = weight_bytes(base, plan, "decode", q) - weight_bytes(base, flat, "decode", q)
    layer = weight_bytes(longer, flat, "decode", q) - weight_bytes(base, flat, "decode", q)
    h = base.hidden_size
    assert mtp == pytest.approx(layer + 2 * (2 * h * h + 3 * h), rel=1e-9)
