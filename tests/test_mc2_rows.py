"""A decode step's fused MoE dispatch / combine are timed by the rows the die's experts take (issue 28 item 3):
at SGLang's W4A8 DP16 decode (22 sequences x MTP3 per die, 704 (token, expert) rows) both cost at least the busiest
AIV's rows at one UB latency each, the INT8 dispatch as much as the BF16 combine."""

import math

import pytest

from npusim import api
from npusim.spec.system import load_system


@pytest.fixture(scope="module")
def w4a8_moe_layer():
    p = api.predict("cloudmatrix384", "deepseek-v3.1", "r1-a3-sglang-pd-w4a8", input=2048, output=2048, batch=352,
                    context=3072, quant="w4a8", overrides={"plan.mtp.acceptance": "1.86"})
    b = p.breakdown()
    return b[b.layer == "mla-moe"].set_index("op")


def test_dispatch_and_combine_cost_their_rows(w4a8_moe_layer):
    system = load_system("cloudmatrix384")
    chip, ub = system.chip_spec, system.tiers["ub"]
    rows = 22 * 4 * 8  # sequences per die x (1 + 3 drafts) x top-8
    bound = (ub.setup + math.ceil(rows / chip.aiv.count) * ub.latency) * 1e6
    d, c = (w4a8_moe_layer.loc[op, "per_call_us"] for op in ("moe_dispatch", "moe_combine_all_to_all"))
    assert d >= bound and c >= bound
    assert d == pytest.approx(c, rel=0.05)  # half the bytes, the same rows
    assert w4a8_moe_layer.loc["moe_dispatch", "kind"] == "comm:rows@ub"
