"""Two-microbatch decode ladder (issue 13 item 2): one stream vs two microbatches vs two microbatches on a 16+8 AIC
split, for an R1-class DP+EP decode on CloudMatrix384 (published.md A16's deployment: 128 dies, DP128 + EP128, MTP1,
96 sequences per chip at 4K context), built from the `npusim compare` scenarios workloads/scenarios/r1-a16-decode-*.

CloudMatrix-Infer (arXiv 2506.12708) runs its decode as two microbatches on split core partitions (attention of one
microbatch on 16 AIC / 32 AIV beside the MoE path of the other on 8 AIC / 16 AIV) and reports it as a gain over one
stream. The script prints and writes (experiments/results/two_microbatch_ladder.{md,csv}) the three predictions, the
step by layer type, the per-op times of a MoE layer in each schedule (per call; with two microbatches a call is one
microbatch's half) and the busy time of each stream in that layer, and explains every difference from those numbers.

    python experiments/two_microbatch_ladder.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from npusim.results.compare import compare

LADDER = ["r1-a16-decode-1-one-stream", "r1-a16-decode-2-two-microbatch", "r1-a16-decode-3-core-split"]
LAYER = "mla-moe"  # the 58 MoE layers: 92 % of the step
OUT = Path(__file__).parent / "results"
CMD = "npusim compare " + " ".join(LADDER) + " --metric tpot"


def _moe(p):
    return next(lt for lt in p.decode.layers if lt.name == LAYER)


def step_by_layer(cmp) -> pd.DataFrame:
    rows = []
    for sc, p in zip(cmp.scenarios, cmp.predictions):
        for lt in p.decode.layers:
            rows.append({"scenario": sc.title, "layer": lt.name, "x": lt.repeat, "per_layer_us": lt.time * 1e6,
                         "total_ms": lt.time * lt.repeat * 1e3})
    frame = pd.DataFrame(rows)
    return frame.pivot_table(index=["layer", "x"], columns="scenario", values="total_ms", sort=False)


def per_op(cmp) -> pd.DataFrame:
    """Each op of the MoE layer: its time per call in each schedule and, on the split, its stream and cores."""
    cols = {}
    for sc, p in zip(cmp.scenarios, cmp.predictions):
        lt = _moe(p)
        tasks = {s.task.name.split(".", 1)[-1]: s.task for s in lt.timeline.spans if not s.task.name.startswith("mb1")}
        cols[sc.title] = {t.op: t.time * 1e6 for t in lt.ops}
        cols[sc.title] |= {name: r.time * 1e6 for name, r in lt.comms}
        cols[f"{sc.title}: stream"] = {n: f"{t.stream} ({t.units})" if t.category != "comm" else t.stream
                                       for n, t in tasks.items() if n != "layer_end"}
    frame = pd.DataFrame(cols)
    return frame[[c for c in frame.columns if not c.endswith(": stream")] + [frame.columns[-1]]]


def per_stream(cmp) -> pd.DataFrame:
    """Busy time of each stream in the first MoE layer as simulated, and the layer's time in the steady state."""
    rows = []
    for sc, p in zip(cmp.scenarios, cmp.predictions):
        lt = _moe(p)
        busy: dict[str, float] = {}
        for s in lt.timeline.spans:
            busy[s.task.stream] = busy.get(s.task.stream, 0.0) + (s.end - s.start) * 1e6
        rows.append({"scenario": sc.title, **{f"{k}_busy_us": v for k, v in sorted(busy.items()) if v},
                     "first_layer_us": lt.timeline.makespan * 1e6, "steady_layer_us": lt.time * 1e6,
                     "exposed_comm_us": lt.exposed_comm * 1e6})
    return pd.DataFrame(rows).set_index("scenario")


def partition_draw(cmp) -> tuple[pd.DataFrame, str]:
    """Weight-streaming kernels of the step on 24, 16 and 8 AIC: what a partition's cores can draw from HBM alone."""
    from npusim.api import load_setup
    from npusim.parallel.optime import OpRun, op_time
    from npusim.parallel.shard import shard

    sc = cmp.scenarios[0]
    setup = load_setup(sc.hw, sc.model, sc.plan, sc.quant)
    chip = setup.system.chip_spec
    step = shard(setup.model, setup.plan, "decode", batch=sc.batch, length=sc.context, quant=setup.quant)
    ops = {o.name: o for lay in step.layers for o in lay.ops if lay.name in ("lm_head", LAYER)}
    rows = []
    for name in ("lm_head", "o_proj", "q_b_proj"):
        op = ops[name]
        row = {"op": name, "weights_MB": op.weight_bytes / 1e6}
        for aic in (chip.aic.count, 16, 8):
            t = op_time(op, chip, OpRun(cores=aic)).time
            row[f"{aic} AIC us"] = t * 1e6
            row[f"{aic} AIC GB/s"] = op.weight_bytes / t / 1e9
        rows.append(row)
    per_core = chip.aic.pipes["mte2"].routes["hbm>l1"] * chip.clock
    hbm = chip.hbm.bandwidth * chip.efficiency.hbm
    note = (f"One core's DMA streams HBM at {per_core / 1e9:.0f} GB/s (hbm>l1 "
            f"{chip.aic.pipes['mte2'].routes['hbm>l1']:g} B/cycle at {chip.clock / 1e9:.2f} GHz, fitted on kernels.md "
            f"K110-K112); the die's HBM serves {hbm / 1e12:.2f} TB/s (1.6 TB/s x efficiency {chip.efficiency.hbm:g}), "
            f"so {hbm / per_core:.1f} cores saturate it: 16 cores can draw all of it, 8 about "
            f"{100 * min(1.0, 8 * per_core / hbm):.0f} %. Before this model a partition was held to its core-count "
            "share of HBM (8 of 24: a third), which made the 8-core lm_head about three times slower.")
    return pd.DataFrame(rows).set_index("op"), note


def explain(cmp, layers: pd.DataFrame, ops: pd.DataFrame, streams: pd.DataFrame) -> list[str]:
    one, two, split = (sc.title for sc in cmp.scenarios)
    p1, p2, p3 = cmp.predictions
    o = ops.fillna(0.0)
    weights = ["q_b_proj", "o_proj", "experts_gate_up", "experts_down", "shared_gate_up", "shared_down"]
    w1, w2 = o.loc[weights, one].sum(), 2 * o.loc[weights, two].sum()
    attn_ops = [n for n in o.index if n in ("attention", "q_absorb", "o_absorb")]
    a1, a3 = o.loc[attn_ops, one].sum(), 2 * o.loc[attn_ops, split].sum()
    s3 = streams.loc[split]
    hidden = streams.loc[one, "steady_layer_us"] - a1 - o.loc["attn_norm":"kv_cache_update", one].sum() \
        - o.loc["o_proj", one]  # what follows o_proj in the one-stream layer
    att1, att3 = (next(t for t in _moe(p).ops if t.op == "attention") for p in (p1, p3))
    lm = layers.loc[("lm_head", 1)]
    mtp = layers.loc[("mtp", 1)]
    dense = layers.loc[("mla-dense", 3)]
    moe = layers.loc[(LAYER, 58)]
    return [
        f"**{two} vs {one}: TPOT {p1.tpot * 1e3:.2f} -> {p2.tpot * 1e3:.2f} ms "
        f"({100 * (p2.tpot / p1.tpot - 1):+.1f} %).** Halving the batch does not halve a decode layer: the weights "
        f"are read once per microbatch. The weight-streaming GEMMs of a MoE layer ({', '.join(weights)}) take "
        f"{w1:.0f} us per layer in one stream and {w2:.0f} us for the two halves; the MoE layer goes "
        f"{streams.loc[one, 'steady_layer_us']:.0f} -> {streams.loc[two, 'steady_layer_us']:.0f} us although "
        f"{streams.loc[two, 'exposed_comm_us']:.0f} us of its collectives stay exposed (was "
        f"{streams.loc[one, 'exposed_comm_us']:.0f}): at 48 tokens per die there is little to hide the second "
        "weight pass behind. The embedding and LM head run whole (no collective to hide: split, they would only "
        f"read the vocabulary twice): lm_head {lm[one]:.2f} / {lm[two]:.2f} ms.",
        f"**{split} vs {two}: TPOT {p2.tpot * 1e3:.2f} -> {p3.tpot * 1e3:.2f} ms "
        f"({100 * (p3.tpot / p2.tpot - 1):+.1f} %).** On partitions one microbatch's attention runs beside the "
        f"other's MoE path, dispatch and combine: in the MoE layer the attention partition is busy "
        f"{s3['attn_busy_us']:.0f} us, the FFN partition {s3['ffn_busy_us']:.0f} us, the collectives "
        f"{s3['comm_busy_us']:.0f} us, and the layer takes {s3['steady_layer_us']:.0f} us in the steady state "
        "(the next layer's attention of one microbatch starts while the other finishes its MoE). Each partition "
        "streams weights at its own cores' DMA rate (57 B/cycle per core, kernels.md K110-K112) and the two share "
        "HBM and L2 while side by side; a kernel of the 8-core partition alone is held by its cores, not by a third "
        "of HBM.",
        f"**{split} vs {one}: TPOT {p1.tpot * 1e3:.2f} -> {p3.tpot * 1e3:.2f} ms "
        f"({100 * (p3.tpot / p1.tpot - 1):+.1f} %).** The split hides the MoE path, the shared expert and the "
        f"dispatch / combine ({hidden:.0f} us "
        f"of the one-stream layer) behind attention, but the attention partition now does all of a layer's "
        f"attention on 16 of 24 AIC. The MLA decode attention (absorbed: {att1.activity.cube_flops / 1e9:.0f} GFLOP "
        f"per layer and die, 96 query tokens x 128 heads over 4K keys of the 576-wide latent cache) has a roofline "
        f"of {att1.roofline * 1e6:.0f} us on 24 cores ({att1.bound}-bound) and {2 * att3.roofline * 1e6:.0f} us for "
        f"the two halves on 16 ({att3.bound}-bound): its kernels (with the absorption BMMs) take {a1:.0f} us per "
        f"layer on 24 cores and {a3:.0f} us for the two halves on 16; "
        f"with the prologue GEMMs and o_proj the partition is busy {s3['attn_busy_us']:.0f} us of the "
        f"{s3['steady_layer_us']:.0f} us layer, against {streams.loc[one, 'steady_layer_us']:.0f} us for the "
        f"whole one-stream layer: the {LAYER} layers gain {moe[one] - moe[split]:.2f} ms of the step "
        f"({moe[one]:.2f} -> {moe[split]:.2f} ms). The 3 dense layers lose ({dense[one]:.2f} -> {dense[split]:.2f} ms: their "
        "18,432-wide FFN weights stream on 8 cores) and the MTP layer, one layer with nothing to pipeline it with, "
        f"{mtp[one]:.2f} -> {mtp[split]:.2f} ms.",
        ("**The published direction, by a little.**" if p3.tpot < p1.tpot else "**Against the published direction.**")
        + " CloudMatrix-Infer reports the split as a gain over one stream; here it "
        f"is {100 * (p3.tpot / p1.tpot - 1):+.1f} % on the whole step ({100 * (moe[split] / moe[one] - 1):+.1f} % on the "
        f"{LAYER} layers alone). The hardware facts npusim holds make the 16-core attention "
        f"partition the bottleneck: at this batch and context the attention kernel's time follows the cores it has "
        f"({att1.time * 1e6:.0f} us on 24, 2 x {att3.time * 1e6:.0f} us on 16: x{2 * att3.time / att1.time:.2f} for "
        "a third fewer cores), and what the overlap hides (the MoE path and the exposed collectives of one stream) "
        f"is about as large as what attention loses. A {'larger ' if p3.tpot < p1.tpot else ''}gain needs attention "
        "that is not core-bound (shorter "
        "context, or a kernel bound by HBM rather than the cube), or a smaller attention share of the layer; the "
        "out-of-sample CloudMatrix-Infer rows of experiments/validate.py show how far the one-stream and split "
        "predictions sit from the published TPOT.",
    ]


def main() -> None:
    cmp = compare(*LADDER)
    table = cmp.table()[["scenario", "TPOT_ms", "decode_tok_s_chip", "decode_J_tok", "d_TPOT_ms_pct", "switches"]]
    layers, ops, streams = step_by_layer(cmp), per_op(cmp), per_stream(cmp)
    draw, draw_note = partition_draw(cmp)
    notes = explain(cmp, layers, ops, streams)
    OUT.mkdir(exist_ok=True)
    table.to_csv(OUT / "two_microbatch_ladder.csv", index=False)
    text = ("# Two-microbatch decode ladder: R1 W8A8C8 decode on CloudMatrix384 (A16's deployment)\n\n"
            f"Regenerated by `python experiments/two_microbatch_ladder.py` (the scenarios: `{CMD}`). DP128 + EP128 on "
            "128 dies, MTP1 accepting 0.7, 96 sequences per chip (6,144 in all) at 4K context, W8A8C8; published A16 "
            "TPOT 44.9 ms (one stream as cann-recipes runs it).\n\n"
            + table.round(3).to_markdown(index=False)
            + "\n\n## Step by layer type (ms per step)\n\n" + layers.round(3).to_markdown()
            + f"\n\n## Per op of a MoE layer ({LAYER}, us per call; with two microbatches a call is one half; the "
            "stream and AIC of each op on the split)\n\n" + ops.round(1).to_markdown()
            + "\n\n## Per stream of a MoE layer (us busy in the first layer; the steady-state layer time)\n\n"
            + streams.round(1).to_markdown()
            + "\n\n## What a partition draws from HBM (weight-streaming kernels alone on 24 / 16 / 8 AIC)\n\n"
            + draw.round(1).to_markdown() + "\n\n" + draw_note
            + "\n\n## Why each step differs\n\n" + "\n\n".join(f"- {n}" for n in notes) + "\n")
    (OUT / "two_microbatch_ladder.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
