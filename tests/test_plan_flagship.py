"""The planner's flagship answer (issue 13): V3.2-Exp W8A8C8 at 128K on CloudMatrix384, SLO TTFT 2 s / TPOT 30 ms.

Its recommended deployment must serve at least as many output tokens/s per chip (prefill chips counted) as the
A17-style W8A8C8 deployment (v32-a3-pd-a17 with o_proj TP4 and MTP3) with its pools sized the same way
(`planner.pools.size_pools`), and the plan file it writes must reproduce its figures through predict. The space is the full search's along the axes the answer lies on (the
full search, `npusim plan` with these arguments, takes ~30 s warm and recommends the same plan).
"""

import pytest
import yaml

from npusim import api
from npusim.planner import SearchSpace, search, write_plan
from npusim.planner.pools import size_pools
from npusim.serving import Slo

SC = dict(hw="cloudmatrix384", model="deepseek-v3.2-exp", input=131072, output=1024, quant="w8a8c8")
SLO = Slo(2.0, 0.030)
SPACE = SearchSpace(sizes=(64, 128, 256), attention_tp=(1,), o_proj_tp=(1, 8), dense_tp=(4,),
                    two_microbatch=(False, True), mtp_depths=(3,), batch_per_replica=(1, 2, 4, 8, 16))
A17_STYLE = {"plan.decode.o_proj_tp": "4", "plan.mtp.depth": "3", "plan.mtp.acceptance": "1.44"}


def a17_style_served() -> float:
    """The A17 W8A8C8 MTP3 deployment at the largest decode batch per rank that meets the SLO and fits."""
    plan = api.load_setup(SC["hw"], SC["model"], "v32-a3-pd-a17", SC["quant"], A17_STYLE).plan
    pre, dec = plan.prefill.ranks, plan.decode.ranks
    best = 0.0
    for per_rank in (1, 2, 4, 8, 16):
        try:
            p = api.predict(plan="v32-a3-pd-a17", batch=per_rank * 128, overrides=A17_STYLE, **SC)
        except Exception as exc:  # noqa: BLE001 - HBM misfit ends the walk
            assert "does not fit in HBM" in str(exc)
            break
        if p.ttft <= SLO.ttft and p.tpot <= SLO.tpot:
            pools = size_pools(SC["output"], p.prefill.time, pre, SLO.ttft - p.ttft, per_rank * 128, p.tpot, dec, 768)
            if pools:
                best = max(best, SC["output"] * pools.requests_per_s / ((pools.prefill * pre + pools.decode * dec) / 2))
    return best


def test_flagship_beats_the_a17_style_deployment(tmp_path):
    r = search(slo=SLO, space=SPACE, workers=1, colocated=False, **SC)
    rec = r.recommended
    assert rec is not None, "the flagship SLO must be met"
    reference = a17_style_served()
    assert reference > 0
    assert rec.served_tokens_per_s_per_chip >= reference
    path = write_plan(r, tmp_path / "flagship.yaml")
    doc = yaml.safe_load(path.read_text())
    assert "two_microbatch" in doc["prefill"]["streams"] and "two_microbatch" in doc["decode"]["streams"]
    p = api.predict(plan=str(path), batch=rec.batch, **SC)
    assert p.ttft == pytest.approx(rec.ttft) and p.tpot == pytest.approx(rec.tpot)
    assert p.prefill_chips + p.decode_chips == rec.chips
