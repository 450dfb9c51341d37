"""The outlier decode rows of experiments/validate.py, each taken apart op by op: what npusim spends, against the
published row and its sibling deployment at another batch. Nothing is fitted here; the script only reads the
predictions (per-op breakdown) and the measured kernel rows of experiments/results/kernel_validation.csv.

Rows (ids as in validation.md):
- A17 BF16 TPOT at 128K (bound "<30 ms") against its W8A8C8 MTP3 sibling.
- CMI R1 INT8 decode, 8 per NPU (out of sample) against 96 per NPU, and the schedules the paper's text allows.
- CRI V4-Flash 16 x 950DT, 128K, batch 768 (MTP1) against batch 256 (MTP3) and the 8K MTP1 rows.
- CRI V4-Flash W8A8 on A3, 8K, batch 7168 / 8192: the compressor and mHC-pre kernels against their measured rows.
- Marginal cost: for each pair of published rows of one deployment that differ only in batch, the step time one more
  sequence per rank adds, published vs predicted.
- Issue 28 item 3: the fused dispatch / combine against K08 / K01 (buffer vs rows model), SGLang's W4A8 DP16 step
  with the A8W4 MSD grouped matmul's structure priced beside npusim's, and CMI 8 per NPU's floors.

Run: python experiments/decode_outliers.py -> experiments/results/decode_outliers.{md,csv}
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pandas as pd

from npusim import api
from npusim.parallel.collectives import Collective, collective_time
from npusim.spec.system import load_system
from validate import OUT_OF_SAMPLE, ROWS, Row  # sibling script (run as python experiments/decode_outliers.py)

OUT = Path(__file__).parent / "results"
KERNELS = OUT / "kernel_validation.csv"
ALL = ROWS + OUT_OF_SAMPLE


def row(what: str) -> Row:
    return next(r for r in ALL if r.what == what)


def predict(r: Row, **extra: str):
    return api.predict(r.hw, r.model, r.plan, input=r.input, output=r.output, batch=r.batch,
                       prefill_batch=r.prefill_batch, context=r.context, quant=r.quant,
                       overrides={**r.overrides, **extra})


def ranks(r: Row) -> int:
    """Attention-DP ranks of the row's decode instance(s): the batch per rank is r.batch / ranks(r)."""
    inst = api.load_setup(r.hw, r.model, r.plan, r.quant, r.overrides).plan.decode
    return inst.attention.dp * inst.instances


def published_step(r: Row, p) -> float:
    """The published TPOT as a step time: TPOT x tokens a sequence gains per step (1 + accepted drafts)."""
    return r.published * p.decode.time / p.tpot


# ------------------------------------------------------------------------------------------ marginal cost
PAIRS = [
    ("A18 -> A19", "V3.2 W8A8C8 decode 128 ranks, MTP3, 64K, batch 256", "V3.2 W8A8C8 decode 128 ranks, MTP3, 64K, batch 512"),
    ("A20 -> A21", "V3.2 W8A8C8 decode 128 ranks, MTP3, 128K, batch 128",
     "V3.2 W8A8C8 decode 128 ranks, MTP3, 128K, batch 512"),
    ("A23 16 -> 256", "V4-Flash 16 x 950DT, 8K, batch 16, MTP3", "V4-Flash 16 x 950DT, 8K, batch 256, MTP3"),
    ("A23 1536 -> 2880", "V4-Flash 16 x 950DT, 8K, batch 1536, MTP1", "V4-Flash 16 x 950DT, 8K, batch 2880, MTP1"),
    ("CRI Flash 950 1M 16 -> 64", "V4-Flash 16 x 950DT, 1024K, batch 16", "V4-Flash 16 x 950DT, 1024K, batch 64"),
    ("CRI Pro 950 8K 16 -> 128", "V4-Pro 16 x 950DT, 8K, batch 16", "V4-Pro 16 x 950DT, 8K, batch 128"),
    ("CRI Pro 950 128K 16 -> 64", "V4-Pro 16 x 950DT, 128K, batch 16", "V4-Pro 16 x 950DT, 128K, batch 64"),
    ("CRI Flash A3 7168 -> 8192", "V4-Flash W8A8 on A3, 128 ranks, 8K, batch 7168, MTP1",
     "V4-Flash W8A8 on A3, 128 ranks, 8K, batch 8192, MTP1"),
    ("CMI 8 -> 96 per NPU (oos)",
     "R1 INT8 CloudMatrix-Infer decode, 320 dies DP320 + EP320, MTP1, 8 per NPU, 2 microbatches on 16+8 AIC",
     "R1 INT8 CloudMatrix-Infer decode, 320 dies DP320 + EP320, MTP1, 96 per NPU, 2 microbatches on 16+8 AIC"),
]


def marginal() -> pd.DataFrame:
    out = []
    for name, small, large in PAIRS:
        a, b = row(small), row(large)
        pa, pb = predict(a), predict(b)
        added = (b.batch - a.batch) / ranks(a)
        pub = published_step(b, pb) - published_step(a, pa)
        pred = pb.decode.time - pa.decode.time
        out.append({"pair": name, "seqs_per_rank": f"{a.batch / ranks(a):g} -> {b.batch / ranks(b):g}",
                    "published_step_ms": f"{published_step(a, pa) * 1e3:.2f} -> {published_step(b, pb) * 1e3:.2f}",
                    "predicted_step_ms": f"{pa.decode.time * 1e3:.2f} -> {pb.decode.time * 1e3:.2f}",
                    "published_us_per_seq": 1e6 * pub / added, "predicted_us_per_seq": 1e6 * pred / added,
                    "predicted_/_published": pred / pub})
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------ A3 V3.2 slope
V32_ROWS = [("A18", "V3.2 W8A8C8 decode 128 ranks, MTP3, 64K, batch 256"),
            ("A19", "V3.2 W8A8C8 decode 128 ranks, MTP3, 64K, batch 512"),
            ("A20", "V3.2 W8A8C8 decode 128 ranks, MTP3, 128K, batch 128"),
            ("A21", "V3.2 W8A8C8 decode 128 ranks, MTP3, 128K, batch 512")]


def v32_terms() -> pd.DataFrame:
    """The four V3.2 W8A8C8 rows of one deployment (64 chips, MTP3) as step = floor + per_seq x sequences +
    per_Gkey x (query tokens x context): least squares over the four published steps, and over npusim's. Three terms,
    four rows: an account of where the published step grows, not a fit of any model parameter."""
    rows, pub, pred = [], [], []
    for _, what in V32_ROWS:
        r = row(what)
        p = predict(r)
        seqs = r.batch / ranks(r)
        tokens = seqs * (1 + api.load_setup(r.hw, r.model, r.plan, r.quant, r.overrides).plan.mtp.depth)
        rows.append([1.0, seqs, tokens * r.context / 1e9])
        pub.append(published_step(r, p) * 1e3)
        pred.append(p.decode.time * 1e3)
    a = np.array(rows)
    out = {}
    for name, y in (("published", np.array(pub)), ("npusim", np.array(pred))):
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        out[name] = {"floor_ms": coef[0], "per_sequence_ms": coef[1], "per_G_token_keys_ms": coef[2],
                     "max_residual_ms": float(np.abs(a @ coef - y).max())}
    frame = pd.DataFrame(out).T
    frame.index.name = "steps of"
    return frame


def added_per_layer(small: str, large: str, top: int = 8) -> pd.DataFrame:
    """Per op of the MoE layer, the time one launch gains from the small-batch row to the large one (us)."""
    def per_call(what: str) -> pd.Series:
        b = predict(row(what)).breakdown()
        return b[b.layer == "dsa-moe"].set_index("op")["per_call_us"]
    a, b = per_call(small), per_call(large)
    d = (b - a).sort_values(ascending=False)
    return pd.DataFrame({"small_us": a[d.index], "large_us": b[d.index], "added_us": d}).head(top)


def indexer_costs() -> dict[str, float]:
    """The quantised indexer's per-block vector work and its LD merge at one 128K sequence per A3 die (A20), from the
    kernel's own plan and the sort/merge rates it charges (models.md §3.4): an estimate for the text, the engine
    times the trace."""
    from npusim.kernels.indexer import LightningIndexer, block_topk_cycles, topk_cycles
    from npusim.spec.chip import load_chip

    chip = load_chip("910c-die")
    rate = chip.clock * chip.efficiency.vector
    li = LightningIndexer(4, 131072, 64, 128, 2048, batch=1, causal=0, dtype="int8")
    plan = li.plan(chip)
    lists = li.split_core(plan, chip.aic.count)[0][-1].parts
    per_list = topk_cycles(chip, li.topk, presorted=True)[0] * li.topk / rate
    return {"block_us": block_topk_cycles(li.topk, plan.bn, False) / rate * 1e6, "lists": lists,
            "ld_us": lists * plan.tb / 2 * per_list * 1e6}


# ------------------------------------------------------------------------------------------ step by op kind
GROUPS = {"sparse_flash_attention": "attention", "flash_attention": "attention", "v4_attention": "attention",
          "lightning_indexer": "indexer", "grouped_gemm": "routed experts (grouped GEMM)", "gemm": "GEMM",
          "compressor": "compressor", "mhc_pre": "mHC pre/post", "mhc_post": "mHC pre/post"}


def by_kind(p) -> pd.Series:
    """Per-op totals of the decode step by kind (lm_head apart); ops on side streams overlap, so the sum can exceed
    the step."""
    b = p.breakdown()
    kind = b["kind"].map(lambda k: "collectives" if k.startswith("comm:") else GROUPS.get(k, "small ops (vector)"))
    kind[b.op == "lm_head"] = "LM head"
    s = b.groupby(kind)["total_ms"].sum()
    s["= step (streams overlapped)"] = p.decode.time * 1e3
    return s


def side_by_side(named: list[tuple[str, Row, dict[str, str]]]) -> pd.DataFrame:
    """Step by op kind of each (label, row, extra overrides), with tokens per step and the TPOTs."""
    cols = {}
    for label, r, extra in named:
        p = predict(r, **extra)
        cols[label] = by_kind(p)
        cols[label]["tokens per step per sequence"] = p.decode.time / p.tpot
        cols[label]["predicted TPOT"] = p.tpot * 1e3
        cols[label]["published TPOT"] = r.published * 1e3
    return pd.DataFrame(cols).fillna(0.0)


# ------------------------------------------------------------------------------------------ CMI schedules
CMI8 = row("R1 INT8 CloudMatrix-Infer decode, 320 dies DP320 + EP320, MTP1, 8 per NPU, 2 microbatches on 16+8 AIC")
CMI_SCHEDULES = [("as the row: two microbatches on 16+8 AIC", {}),
                 ("one stream (no microbatches, all cores)", {"plan.streams.two_microbatch": "false",
                                                              "plan.streams.attention_cores": "0"}),
                 ("one stream, fused MLA prolog", {"plan.streams.two_microbatch": "false",
                                                   "plan.streams.attention_cores": "0",
                                                   "plan.fusion.mla_prolog": "true"})]


def cmi_schedules() -> pd.DataFrame:
    out = []
    for label, extra in CMI_SCHEDULES:
        p = predict(CMI8, **extra)
        layer = next(lt for lt in p.decode.layers if lt.name == "mla-moe")
        out.append({"schedule (8 per NPU)": label, "step_ms": p.decode.time * 1e3,
                    "moe_layer_us": layer.time * 1e6, "tpot_ms": p.tpot * 1e3,
                    "error_%": 100 * (p.tpot - CMI8.published) / CMI8.published})
    return pd.DataFrame(out)


# ------------------------------------------------------------------------------------------ A3 V4 kernels
A3_FLASH = row("V4-Flash W8A8 on A3, 128 ranks, 8K, batch 7168, MTP1")
# in-network op -> the measured kernel row of the same kernel on an A3 die at 128 tokens (64 sequences x MTP1)
MEASURED = {("csa-moe", "idx_compressor"): "K161", ("csa-moe", "kv_compressor"): "K162",
            ("hca-moe", "kv_compressor"): "K163", (None, "mhc_pre"): "K165"}


def a3_kernels() -> tuple[pd.DataFrame, float]:
    """Each compressor / mHC-pre op of the A3 V4-Flash step scaled by measured / predicted of its kernel row: the
    step time those kernels would add if npusim priced them as measured (an estimate: the rows are standalone
    PyPTO kernels at 128 tokens, the step's are 112 tokens per die)."""
    kv = pd.read_csv(KERNELS).set_index("row")
    p = predict(A3_FLASH)
    out = []
    for lt in p.decode.layers:
        for t in lt.ops:
            kid = MEASURED.get((lt.name, t.op)) or (MEASURED[(None, "mhc_pre")] if t.kind == "mhc_pre" else None)
            if kid is None:
                continue
            ratio = kv.loc[kid, "measured_us"] / kv.loc[kid, "predicted_us"]
            out.append({"layer": lt.name, "x": lt.repeat, "op": t.op, "kernel_row": kid, "in_step_us": t.time * 1e6,
                        "measured_/_predicted": ratio, "added_ms_per_step": (ratio - 1) * t.time * lt.repeat * 1e3})
    frame = pd.DataFrame(out)
    return frame, frame["added_ms_per_step"].sum() * 1e-3 * p.tpot / p.decode.time


# ------------------------------------------------------------------------------------------ report
# ------------------------------------------------------------------------------------------ issue 28 item 3
LL_ROWS = 128 * 8  # published.md K08 / K01: 128 tokens per rank, top-8 ((token, expert) rows one rank sends)
HIDDEN = 7168
FUSED = [("K08", 8, 132, 126), ("K08", 16, 139, 135), ("K08", 32, 153, 151), ("K01", 8, 116, 118),
         ("K01", 256, 152, 149)]  # (row, EP, published dispatch us, combine us)


def fused_exchange() -> pd.DataFrame:
    """K08 / K01 as the buffer exchange (no rows: what comm_validation.py times) and as the MC2 kernel moves them
    (rows counted: npusim.parallel.collectives), beside the published latencies."""
    cm, out = load_system("cloudmatrix384"), []
    for key, ep, dispatch, combine in FUSED:
        for kind, size, pub in (("dispatch INT8", LL_ROWS * HIDDEN, dispatch), ("combine BF16", 2 * LL_ROWS * HIDDEN,
                                                                                combine)):
            buf = collective_time(Collective("all_to_all", size, ep), cm).time * 1e6
            rows = collective_time(Collective("all_to_all", size, ep, rows=LL_ROWS), cm).time * 1e6
            out.append({"row": key, "ep": ep, "kind": kind, "published_us": pub, "buffer_us": buf,
                        "buffer_err_%": 100 * (buf / pub - 1), "rows_us": rows, "rows_err_%": 100 * (rows / pub - 1)})
    return pd.DataFrame(out)


W4A8 = row("R1 W4A8 SGLang PD, decode DP16 + EP16, MTP3, 2K+2K")
QUANT_GROUP = 256  # K elements per INT4 scale of the R1 W4A8 checkpoint (SGLang NPUW4A8Int4DynamicMoEMethod group_size)


def msd_gmm_us(chip, experts: int, rows: float, n: int, k: int) -> float:
    """Estimate (not a model of npusim): the A8W4 MSD grouped matmul as ops-transformer writes it
    (gmm/grouped_matmul/op_kernel/grouped_matmul_antiquant_a8w4_msd.h, GMMA8W4MSDCompute): each INT8 row split into
    two INT4 rows (m doubled), blocks of 128 x 256 dealt over the AICs, and per block one Matmul Iterate per
    quantisation group of K, each loading its 256 x 256 INT4 weight slice from HBM, running the INT4 cube (taken at
    twice the INT8 rate, the 16x64x16 fractal of hardware.md §0) and writing its dequantised half block through
    FIXPIPE into a GM workspace with atomic add; the Iterates of a block follow each other. The chip's pipe rates
    and start-ups price each Iterate; the AIV epilogue (hi / lo merge, per-token scale) overlaps the next block."""
    a = chip.aic.pipes
    m2 = min(2 * math.ceil(rows), 128)
    m16 = 16 * math.ceil(m2 / 16)
    blocks = experts * math.ceil(2 * math.ceil(rows) / 128) * math.ceil(n / 256)
    w = 256 * 256 * 0.5
    cycles = (a["mte2"].latency_cycles + w / a["mte2"].routes["hbm>l1"] + m2 * 256 * 0.5 / a["mte2"].bytes_per_cycle
              + a["mte1"].latency_cycles + w / a["mte1"].routes["l1>l0b"]
              + 2 * m16 * 256 * 256 / (2 * chip.aic.cube.flop_per_cycle["int8"])
              + a["fixpipe"].latency_cycles + m16 * 256 * 2 / a["fixpipe"].bytes_per_cycle)
    per_core = math.ceil(blocks / chip.aic.count)
    return (per_core * math.ceil(k / QUANT_GROUP) * cycles / chip.clock + chip.overheads.graph_launch) * 1e6


def msd_iterates(chip, experts: int, rows: float, n: int, k: int) -> int:
    """Matmul Iterates the busiest AIC runs in the MSD grouped matmul (one per block and quantisation group)."""
    blocks = experts * math.ceil(2 * math.ceil(rows) / 128) * math.ceil(n / 256)
    return math.ceil(blocks / chip.aic.count) * math.ceil(k / QUANT_GROUP)


def w4a8_gmm() -> pd.DataFrame:
    """The routed experts' GEMMs of the W4A8 rows: npusim's time (INT4 weights run as INT8, their bytes too) beside
    the MSD kernel's structure, per MoE layer."""
    cases = [("SGL W4A8 DP16 2K+2K", W4A8)] + [
        (f"CRI V3.2 W4A8C8 {n} ranks", row(f"V3.2 W4A8C8 decode {n} ranks, MTP3, 64K, batch {n}")) for n in (64, 32)]
    out = []
    for label, r in cases:
        setup = api.load_setup(r.hw, r.model, r.plan, r.quant, r.overrides)
        m, inst, chip = setup.model, setup.plan.decode, setup.system.chip_spec
        p = predict(r)
        b = p.breakdown()
        mtp = b[b.layer == "mtp"]
        b = b[b.layer.isin(["mla-moe", "dsa-moe"])].set_index("op")
        experts = m.n_routed_experts // inst.moe.ep
        tokens = r.batch / ranks(r) * (1 + setup.plan.mtp.depth)  # query tokens per die: the batch and its drafts
        rows = tokens * m.num_experts_per_tok / experts
        for op, n, k in (("experts_gate_up", 2 * m.moe_intermediate_size, m.hidden_size),
                         ("experts_down", m.hidden_size, m.moe_intermediate_size)):
            est = msd_gmm_us(chip, experts, rows, n, k)
            out.append({"row": label, "op": op, "experts_per_die": experts, "rows_per_expert": round(rows, 1),
                        "npusim_us": b.loc[op, "per_call_us"], "int8_weight_roofline_us": b.loc[op, "roofline_us"],
                        "msd_estimate_us": est, "iterates": msd_iterates(chip, experts, rows, n, k),
                        "moe_passes": int(b.loc[op, "x"]) + int(mtp[mtp.op == op].x.sum()),
                        "tokens_per_step": p.decode.time / p.tpot})
    return pd.DataFrame(out)


def iterate_overhead(gmm: pd.DataFrame, deltas: pd.DataFrame) -> pd.DataFrame:
    """The per-Iterate cost beyond the MSD estimate's pipes that would make npusim's W4A8 GMM (today the W8A8 one's
    time) move the CRI W4A8C8 rows by their published change: a check of the MSD structure, not a fit (the rows are
    models.md §3.3's)."""
    out = []
    for n in (64, 32):
        g = gmm[gmm.row == f"CRI V3.2 W4A8C8 {n} ranks"]
        d = deltas.set_index("ranks").loc[n]
        step_delta = (d["published_w4a8_ms"] - d["published_w8a8_ms"]) * 1e3 * g.tokens_per_step.iloc[0]
        implied = g.npusim_us.sum() + step_delta / g.moe_passes.iloc[0]
        out.append({"ranks": n, "npusim_gmm_us": g.npusim_us.sum(), "published_change_per_layer_us":
                    step_delta / g.moe_passes.iloc[0], "implied_gmm_us": implied, "msd_estimate_us":
                    g.msd_estimate_us.sum(), "iterates": g.iterates.sum(),
                    "overhead_per_iterate_us": (implied - g.msd_estimate_us.sum()) / g.iterates.sum()})
    return pd.DataFrame(out)


def w4a8_deltas() -> pd.DataFrame:
    """W4A8C8 against W8A8C8 on the same V3.2 deployment (models.md §3.3, in validate.py): published and npusim."""
    out = []
    for n in (64, 32):
        w8, w4 = (row(f"V3.2 {q} decode {n} ranks, MTP3, 64K, batch {n}") for q in ("W8A8C8", "W4A8C8"))
        t8, t4 = predict(w8).tpot, predict(w4).tpot
        out.append({"ranks": n, "published_w8a8_ms": w8.published * 1e3, "published_w4a8_ms": w4.published * 1e3,
                    "published_change_%": 100 * (w4.published / w8.published - 1), "npusim_w8a8_ms": t8 * 1e3,
                    "npusim_w4a8_ms": t4 * 1e3, "npusim_change_%": 100 * (t4 / t8 - 1)})
    return pd.DataFrame(out)


def w4a8_layer(top: int = 14) -> tuple[pd.DataFrame, float, float]:
    """The W4A8 DP16 row's MoE layer op by op, and its published and predicted steps."""
    p = predict(W4A8)
    b = p.breakdown()
    b = b[b.layer == "mla-moe"][["op", "kind", "per_call_us", "roofline_us", "bound"]]
    return (b.sort_values("per_call_us", ascending=False).head(top).reset_index(drop=True), published_step(W4A8, p),
            p.decode.time)


def cmi_floor() -> pd.DataFrame:
    """CMI 8 per NPU on one stream: the MoE layer's kernels, their launches, the weights' HBM floor and the two
    fused exchanges, beside the per-layer budget the published step leaves."""
    one = {"plan.streams.two_microbatch": "false", "plan.streams.attention_cores": "0"}
    p = predict(CMI8, **one)
    b = p.breakdown()
    b = b[b.layer == "mla-moe"]
    comm = b[b.kind.str.startswith("comm:")]
    kernels = b[~b.kind.str.startswith("comm:")]
    chip = api.load_setup(CMI8.hw, CMI8.model, CMI8.plan, CMI8.quant, CMI8.overrides).system.chip_spec
    gemms = kernels[kernels.kind.isin(["gemm", "grouped_gemm"])]
    layer = next(lt for lt in p.decode.layers if lt.name == "mla-moe")
    return pd.DataFrame([
        {"part (one MoE layer, 8 per NPU, one stream)": "kernels launched", "us": float(len(kernels))},
        {"part (one MoE layer, 8 per NPU, one stream)": "their graph launches (x overheads.graph_launch)",
         "us": len(kernels) * chip.overheads.graph_launch * 1e6},
        {"part (one MoE layer, 8 per NPU, one stream)": "GEMM rooflines (weights at HBM rate)",
         "us": gemms.roofline_us.sum()},
        {"part (one MoE layer, 8 per NPU, one stream)": "GEMM kernels as timed", "us": gemms.per_call_us.sum()},
        {"part (one MoE layer, 8 per NPU, one stream)": "other kernels as timed",
         "us": kernels.per_call_us.sum() - gemms.per_call_us.sum()},
        {"part (one MoE layer, 8 per NPU, one stream)": "dispatch + combine", "us": comm.per_call_us.sum()},
        {"part (one MoE layer, 8 per NPU, one stream)": "= the layer (comm partly hidden)", "us": layer.time * 1e6},
        {"part (one MoE layer, 8 per NPU, one stream)": "published step / 61 layers",
         "us": published_step(CMI8, p) / 61 * 1e6}])


def md(frame: pd.DataFrame, index: bool = False) -> str:
    return frame.round(2).to_markdown(index=index)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    marg = marginal()
    ratio = marg.set_index("pair")["predicted_/_published"]
    low, high = list(ratio.index[ratio < 0.8]), list(ratio.index[ratio > 1.25])
    a17 = side_by_side([("A17 BF16 MTP1", row("V3.2 BF16 TPOT at 128K, decode DP128+EP128, batch 256, MTP1"), {}),
                        ("A17 BF16 no MTP", row("V3.2 BF16 TPOT at 128K, decode DP128+EP128, batch 256, MTP1"),
                         {"plan.mtp.depth": "0", "plan.mtp.acceptance": "0"}),
                        ("A17 W8A8C8 MTP3", row("V3.2 W8A8C8 TPOT at 128K, MTP3, batch 256"), {})])
    cmi = side_by_side([("CMI 8 per NPU", CMI8, {}),
                        ("CMI 96 per NPU", row(CMI8.what.replace("8 per NPU", "96 per NPU")), {})])
    sched = cmi_schedules()
    r256, r768 = row("V4-Flash 16 x 950DT, 128K, batch 256"), row("V4-Flash 16 x 950DT, 128K, batch 768")
    r768_8k = dataclasses.replace(r768, context=8192, published=float("nan"))  # no published row at 8K, batch 768
    flash = side_by_side([("128K batch 256 MTP3", r256, {}), ("128K batch 768 MTP1", r768, {}),
                          ("8K batch 768 MTP1 (not published)", r768_8k, {}),
                          ("8K batch 1536 MTP1", row("V4-Flash 16 x 950DT, 8K, batch 1536, MTP1"), {})])
    setup10 = {r.what: predict(r, **{"tiers.ub.setup": "10us"}).tpot for r in (r256, r768)}
    a3, a3_tpot = a3_kernels()
    terms = v32_terms()
    add19 = added_per_layer(V32_ROWS[0][1], V32_ROWS[1][1])
    add21 = added_per_layer(V32_ROWS[2][1], V32_ROWS[3][1])
    li = indexer_costs()
    a18 = row(V32_ROWS[0][1])
    prolog = {k: predict(a18, **x) for k, x in (("off", {}), ("on", {"plan.fusion.mla_prolog": "true"}))}
    a3_base = predict(A3_FLASH).tpot
    fused_tab = fused_exchange()
    gmm, deltas = w4a8_gmm(), w4a8_deltas()
    overhead = iterate_overhead(gmm, deltas)
    w4_layer, w4_pub, w4_pred = w4a8_layer()
    cmi_parts = cmi_floor()
    dp16 = gmm[gmm.row == "SGL W4A8 DP16 2K+2K"]
    dp16_low, dp16_high = (dp16.msd_estimate_us.sum() + dp16.iterates.sum() * overhead.overhead_per_iterate_us.agg(f)
                           for f in ("min", "max"))
    w4_missing = (w4_pub - w4_pred) / dp16.moe_passes.iloc[0] * 1e6
    w4_comm = w4_layer.set_index("op").per_call_us

    p768, p8k = predict(r768), predict(r768_8k)
    pub768 = published_step(r768, p768)
    a17_tokens = a17.loc["tokens per step per sequence"]
    named = {"CMI8": CMI8.what, "CMI96": CMI8.what.replace("8 per NPU", "96 per NPU"),
             "A19": "V3.2 W8A8C8 decode 128 ranks, MTP3, 64K, batch 512",
             "A20": "V3.2 W8A8C8 decode 128 ranks, MTP3, 128K, batch 128",
             "A21": "V3.2 W8A8C8 decode 128 ranks, MTP3, 128K, batch 512",
             "A23_1536": "V4-Flash 16 x 950DT, 8K, batch 1536, MTP1", "A23_2880": "V4-Flash 16 x 950DT, 8K, batch 2880, MTP1",
             "A3_7168": A3_FLASH.what, "A3_8192": A3_FLASH.what.replace("7168", "8192"), "F256": r256.what,
             "A16": "R1 W8A8C8 decode, 128 ranks, batch 6144, MTP1", "F768": r768.what}
    errors = {k: 100 * (predict(row(w)).tpot / row(w).published - 1) for k, w in named.items()}

    def e(key: str) -> str:
        return f"{errors[key]:+.0f} %"

    text = f"""# Decode outliers: where npusim's step goes

Generated by `python experiments/decode_outliers.py` from the predictions of experiments/validate.py's rows (per-op
breakdown, `Prediction.breakdown()`) and the measured kernel rows of `kernel_validation.csv`. Nothing here is
fitted. Per-op totals are summed over a step's layers; the side stream (shared expert) and the comm stream overlap
the main stream, so the kinds can add up to more than the step.

## 1. Marginal cost: what one more sequence per rank adds to a step

For pairs of published rows of one deployment that differ only in batch, the published step time
(TPOT x tokens per step) and npusim's; `predicted_/_published` is the share of the published increase npusim
reproduces.

{md(marg)}

npusim's added step per sequence is too small on {", ".join(low)} (it reproduces
{marg.set_index('pair').loc[low, 'predicted_/_published'].min():.0%}–{marg.set_index('pair').loc[low, 'predicted_/_published'].max():.0%}
of the published increase), and too large on {", ".join(high)}. The first group is every A3 pair and the 950's
V4-Flash pairs at 8K: their small-batch ends are over or close (CMI 8 per NPU {e('CMI8')}) and their large-batch ends short
(A21 {e('A21')}, A19 {e('A19')}, A23 2880 {e('A23_2880')}, the A3 V4-Flash rows {e('A3_7168')} / {e('A3_8192')}): npusim's per-step floor (weights, launches,
collective setup) is too high there and its per-sequence work too cheap, and `overheads.graph_launch` (fitted on the
median of these rows, calibrate.py graph) sits between the two ends. The second group is the 950's long-context and
V4-Pro MTP3 pairs, where each added sequence costs npusim more than published (long-context indexer and compressed
attention per sequence, and the routed experts a small batch touches). Which per-sequence work is wrong differs per
model and chip; the sections below name the candidates. Each decode attention-type op carries its sequences, and
its kernel reads each sequence's keys apart, as the deployments' batched launches do (section 1b; the dense MLA
decode as ops-transformer's IncreFlashAttention MLA deals (sequence, token) units over the cores, its latent read as K
and again, from L2, as V, full-quant INT8 over a C8 cache): the V3.2 rows move < 0.2 % (SFA and the indexer already
had per-token work), A16 {e('A16')} (the full-quant INT8 attention), the 950DT 768 row {e('F768')} (48 sequences'
128K indexer keys and compressed entries per die, read apart).

## 1b. The A3 V3.2 slope (A18-A21) by mechanism

The four V3.2 W8A8C8 rows of one deployment (64 chips, MTP3: 1 + 3 query tokens per sequence) as step = floor +
per_sequence x sequences per die + per_G_token_keys x (query tokens x context) / 1e9, by least squares over the four
published steps and over npusim's (three terms, four rows; an account of where the step grows, no model parameter
is fitted):

{md(terms, index=True)}

The published steps fit it within {terms.loc['published', 'max_residual_ms']:.2f} ms. npusim's floor is
{terms.loc['npusim', 'floor_ms'] - terms.loc['published', 'floor_ms']:.1f} ms high, its per-sequence term
{terms.loc['npusim', 'per_sequence_ms'] / terms.loc['published', 'per_sequence_ms']:.0%} of the published and its
context-proportional term {terms.loc['npusim', 'per_G_token_keys_ms'] / terms.loc['published', 'per_G_token_keys_ms']:.0%}.
What one launch of the MoE layer gains, A18 -> A19 (8 more query tokens per die) and A20 -> A21 (12 more):

{md(add19, index=True)}

{md(add21, index=True)}

- **Context-proportional work is the indexer's alone.** The lightning indexer scores every cached key of each
  sequence for each query token; SFA gathers the top 2048 whatever the context. The deployment calls
  `npu_quant_lightning_indexer` (cann-recipes-infer models/deepseek_v3_2_exp/models/indexer.py:548 @ fbc225d), and
  npusim runs its kernel as the source has it (ops-transformer attention/quant_lightning_indexer/op_kernel, mirror
  ckorikov/cann-ops-transformer @ 5b210dd; npusim/kernels/indexer.py): base blocks of M_BASE_SIZE 256 rows (256 / 64
  heads = 4 query tokens: one MTP3 sequence) by S2_BASE_SIZE 2048 keys, all sequences' blocks dealt contiguously and
  evenly over the 24 cores (SplitCore). Per block the AIC runs C1 on the INT8 cube (128-key K slices from HBM,
  DEQF16 + ReLU in FIXPIPE) and the head-weight reduction on the cube a token at a time; each AIV takes two tokens,
  scales their 2048 scores by the key scales and sorts and merges them into the token's running 2048-list (Sort32,
  three MrgSort levels, one merge; {li['block_us']:.1f} us per token and block at models.md §3.4's rates, every step
  behind a PipeBarrier): the block is vector-bound, the AIC's K slices taking about as long. A sequence cut over
  cores is merged on its first core after the SyncAll (isLD, ProcessLD): at one 128K sequence per die (A20) its 64
  blocks lie over all 24 cores and the first core's AIVs merge {li['lists']} lists per token, about
  {li['ld_us']:.0f} us at npusim's merge rate after a main loop of three blocks, so the small-batch rows grow
  (A20 {e('A20')}) as much as the large-batch ones: the context-proportional term is now
  {terms.loc['npusim', 'per_G_token_keys_ms'] / terms.loc['published', 'per_G_token_keys_ms']:.0%} of the published
  (the published {terms.loc['published', 'per_G_token_keys_ms'] / terms.loc['npusim', 'per_G_token_keys_ms']:.1f}x
  npusim's), but the floor rises with the LD and the per-sequence term falls. What remains is unchecked: kernels.md
  has no measured quantised-indexer row (section D's LI rows are the fp16 / bf16 kernels; K140 is the indexer
  prolog), so neither the per-block sort/merge nor the LD merge rate is measured on this kernel. npusim prices the
  A3 bf16 rows K128-K133, whose AIVs sort and merge the same way, 9-45 % too fast (kernel_diagnosis.md: ~15 us per
  8-token block at K128 where npusim spends 7.7); at K128's rate the quantised kernel's per-block cost would about
  double, the size of the missing context term, at K129-K133's it would grow 10-25 %. Not charged: there is no
  quantised row to fit it on, and the bf16 rows are left as they are.
- **SFA is already the batched kernel the deployment launches.** The deployment calls
  `npu_kv_quant_sparse_flash_attention` (models/deepseek_v3_2_exp/models/modeling_deepseek.py:1653); the arch22 SFA
  kernel deals whole query tokens to the cores: one base unit per query token (its 128 heads, mBaseSize = gSize,
  by its 2048 selected keys walked in s2 blocks of 512 on one core), ceil(tokens / cores) consecutive tokens per
  core, a token's keys never split (ops-transformer attention/sparse_flash_attention/op_kernel/arch22/
  sparse_flash_attention_kernel_mla.h InitCalcParamsEach: actBatchS2 = 1; op_host/sparse_flash_attention_tiling.cpp
  SplitBalanced). npusim's SFA plan is the same (one core per token, kv_splits 1): the 8-16 query tokens per die are
  one wave of ~100 us (K142: 98 us for one token), and each token carries its own gather, so the sequences of the
  batch do not enter its tiling (section 1: giving the ops their batch moves the V3.2 rows < 0.2 %). The SFA adds
  {add19.loc['attention', 'added_us']:.0f}-{add21.loc['attention', 'added_us']:.0f} us per layer across the pairs
  (the wave's shared HBM), part of npusim's per-sequence term.
- **The floor: the fused MLA prolog.** Both A3 deployments run `npu_mla_prolog_v3` in decode (V3.2:
  modeling_deepseek.py:1475-1501, called for every decode step; A16's config sets `enable_mla_prolog: True`), one
  launch for q_a_proj, the q norm, q_b_proj, weight_uk (npusim's q_absorb), kv_a_proj, the kv norm, RoPE and the
  cache write; the input norm stays outside. npusim's plans run them as separate launches. Fused
  (`plan.fusion.mla_prolog`, whose group holds attn_norm in place of q_absorb) A18's step goes
  {prolog['off'].decode.time * 1e3:.2f} -> {prolog['on'].decode.time * 1e3:.2f} ms, about the floor excess above; but
  `overheads.graph_launch` (6 us) was fitted on these rows with the launches unfused, so the switch lands only with a
  refit of graph_launch (calibrate.py graph), and neither moves the slope: the missing per-sequence and per-token-key
  work is what makes the large-batch rows short.

## 2. A17 V3.2 BF16 TPOT at 128K (bound "<30 ms")

{md(a17, index=True)}

The 2.7x against the W8A8C8 MTP3 sibling was mostly MTP: the row ran without MTP (one token per step) while the
BF16 decode config it quotes (cann-recipes `deepseek_v3.2_exp_rank_128_128ep_decode_benchmark.yaml`) sets
`next_n: 1`. With MTP1 (acceptance 0.7, estimate) a step yields {a17_tokens['A17 BF16 MTP1']:.2f} tokens against
the sibling's {a17_tokens['A17 W8A8C8 MTP3']:.2f}; the rest is BF16 weights (routed and shared experts, q_b_proj,
o_proj: the GEMM rows) and the BF16 indexer cache: the BF16 step is
{a17.loc['= step (streams overlapped)', 'A17 BF16 MTP1'] / a17.loc['= step (streams overlapped)', 'A17 W8A8C8 MTP3']:.2f}x
the W8A8C8 one. SFA costs the same in both (the measured ~98 us gather floor of K142/K143). Memory does not force a
smaller batch (the BF16 decode rank holds 48 of 61 GiB). Now {a17.loc['predicted TPOT', 'A17 BF16 MTP1']:.1f} ms,
still over the bound by {100 * (a17.loc['predicted TPOT', 'A17 BF16 MTP1'] / 30 - 1):.0f} %: at 2 sequences per die
the step is the weight floor plus the per-op floors of section 1.

## 3. CMI R1 INT8 decode, 8 per NPU (out of sample, never fitted)

The row's estimate is right: the paper's abstract gives 538 tokens/s per NPU under a 15 ms TPOT, and a secondary
restatement of its decode results (§4.2) says the batch is cut from 96 to 8 per NPU for that SLO, so 8 / 538 =
14.87 ms. The same restatement reports the paper's microbatch ablation at 64, 96 and 128 per NPU only (+5.8 / 9.4 /
6.9 %) and a per-layer time of 874 -> 1,260 us without / with MTP; npusim's step at 96 per NPU is
{cmi.loc['= step (streams overlapped)', 'CMI 96 per NPU'] * 1e3 / 61:.0f} us per layer (step / 61), so the
96-per-NPU row ({e('CMI96')}) is at the paper's per-layer time.

{md(cmi, index=True)}

Schedules the paper's text allows for the 8-per-NPU point (it states two microbatches for its decode in general, and
measures their gain only from 64 per NPU):

{md(sched)}

At 4 sequences per die two microbatches halve no work: each microbatch streams every weight again, so the step
grows (the GEMM rows are weight-bound). One stream is the faster schedule in npusim; the fused MLA prolog that the
paper (and A16's `enable_mla_prolog`) uses saves its launches. Even so npusim stays
{sched['error_%'].iloc[-1]:.0f} % over: the 8-per-NPU step the paper implies is
{CMI8.published * 1.7 * 1e3:.1f} ms ({CMI8.published * 1.7 * 1e6 / 61:.0f} us per layer), while npusim's per-layer
floor is the o_proj weight read (16384 x 7168 INT8 = 117 MB, 73 us at the die's HBM rate, not TP-split in this plan),
q_b / shared / routed expert weights, and a dispatch plus a combine of 50+ us each (the UB setup fitted on K01/K08 at
128 tokens per rank); the same floors reproduce A20 (V3.2, 4 queries per die, {e('A20')}). The row is left as it is:
choosing its schedule from the result would be fitting an out-of-sample row.

## 4. CRI V4-Flash 16 x 950DT, 128K, batch 768 (MTP1)

{md(flash, index=True)}

The published step at 768 x 128K is {pub768 * 1e3:.2f} ms (10.50 ms x 1.7): below npusim's step for the same batch
at 8K ({p8k.decode.time * 1e3:.2f} ms) and below the published 8K 256-batch MTP3 step (21.42 ms). So the miss is not
the 128K ops (the indexer and the compressed attention add
{(p768.decode.time - p8k.decode.time) * 1e3:.1f} ms from 8K to 128K): at 48 sequences per die with MTP1 npusim's
step is already {100 * (p8k.decode.time / pub768 - 1):.0f} % over the published one at 8K context. Read with the
8K MTP1 rows (npusim {e('A23_1536')} / {e('A23_2880')} at 1536 / 2880, section 1: it reproduces {marg.set_index('pair').loc['A23 1536 -> 2880', 'predicted_/_published']:.0%}
of their increase) the published MTP1 curve at 8K is steeper than npusim's: a lower floor and a higher per-sequence
cost. At long context the 950 pairs of section 1 point the other way (each added 128K / 1M sequence costs npusim
1.6–2.6x the published), so npusim's 3.1 ms of 128K indexer and compressed attention at 48 sequences per die is
likely too much as well. Both would have to be checked against 950 kernel measurements of the indexer, the
compressor, mHC and the V4 attention, which kernels.md does not have.
The 950's floor has no measured part to move: its UB setup (30 us) is an estimate, and lowering it to 10 us would
take the 768 row to {setup10[r768.what] * 1e3:.2f} ms but the 256 row, now {e('F256')}, to {setup10[r256.what] * 1e3:.2f} ms
({100 * (setup10[r256.what] / r256.published - 1):.0f} %): a floor that fits one end breaks the other. Not fixed.

## 5. CRI V4-Flash W8A8 on A3, 8K, batch 7168 / 8192 (MTP1)

The A3 compressor and mHC-pre kernels are measured (kernels.md K161–K163, K165: PyPTO, 64 sequences x MTP1 = 128
tokens on one A3 die, the rows' own regime of 112 tokens per die), and npusim prices them 1.9–2.7x too fast:

{md(a3)}

Priced as measured they would add {a3['added_ms_per_step'].sum():.1f} ms to the step, {a3_tpot * 1e3:.1f} ms to the
TPOT ({a3_base * 1e3:.2f} -> {(a3_base + a3_tpot) * 1e3:.2f} ms against {A3_FLASH.published * 1e3:.2f}, error
{100 * (a3_base / A3_FLASH.published - 1):.0f} -> {100 * ((a3_base + a3_tpot) / A3_FLASH.published - 1):.0f} %): that
share of the gap is in these kernels, which are the "kfix" helper's (mhc_pre, compressor, V4 decode attention K149–K154: −10…−25 % too fast on
the A3); they are left to it. The shipped A3 V4-Flash config (cann-recipes `models/deepseek_v4/config/ci_a3/
deepseek_v4_flash_rank_128_128ep_w8a8.yaml`, 128 ranks, next_n 1) splits the LM head TP4, which npusim's plan does not (it would make the rows faster still), and keeps the indexer
cache INT8 where the w8a8 preset stores BF16 (faster too): neither is the cause.

## 6. The decode step where it is fast or slow (issue 28 item 3)

### 6a. The fused dispatch and combine (published.md K08, K01)

DeepEP-Ascend's low-latency dispatch is CANN's MC2 kernel (moe_distribute_dispatch_v2, full-mesh form on A3): each
AIV takes its share of the destination experts and walks their (token, expert) rows one at a time, loading the
token, quantising it and writing it into the peer's window (op_kernel/moe_distribute_dispatch_v2_full_mesh.h,
SendToMoeExpert -> TokenToExpertInQuant, mirror yuanfang-chen/ops-transformer @ 00ff90a); the combine writes the
expert outputs back row by row. So the INT8 dispatch, half the combine's bytes, takes as long as the BF16 combine
(K08: 132-153 vs 126-151 us): rows bind both, not bytes. npusim now times a fused MoE all-to-all as at least
ceil(rows / AIVs) rows, each its GM -> UB load and UB -> window store (DMA start-ups, bytes at the AIV's MTE
rates) plus one tier latency for the store to land, and moves its bytes at the AIV-direct UB rate of HCCL's AIV
kernels (`hccl.efficiency`, K204); no parameter is new or refitted. The 950's kernel (op_kernel/arch35/
moe_distribute_dispatch_arch35.h) scatters the rows into a local send buffer and hands the exchange to the CCU, so
the 950 rows keep the buffer exchange (npusim.parallel.step ROW_WRITING_ARCHS). At 128 tokens per rank (the `buffer` columns are
the exchange as comm_validation.py still times it, without rows):

{md(fused_tab)}

Median |error| over the ten: {fused_tab['buffer_err_%'].abs().median():.0f} % -> {fused_tab['rows_err_%'].abs().median():.0f} %. What the rows model
leaves out: the growth with EP (+21 us from EP8 to EP32, +36 us from EP8 to EP256; npusim's row bound is
EP-independent: the fabric's hops are one latency figure) and the dispatch's own quantisation per row (its bf16
load is twice the bytes sent). In a decode step a row is one of the routed GEMM's rows, so at a few tokens per die
the exchange stays the setup plus latency it was; the W4A8 DP16 rows' 88 tokens per die (704 rows) now cost
{w4_comm['moe_dispatch']:.0f} us to dispatch and {w4_comm['moe_combine_all_to_all']:.0f} us to combine (85 and 116 us as a buffer exchange).

### 6b. SGLang's W4A8 DP16 decode: where the step is short

The published step of the 2K+2K row is {w4_pub * 1e3:.1f} ms (TPOT x 2.86 accepted tokens), npusim's
{w4_pred * 1e3:.1f} ms: {w4_missing:.0f} us short per MoE pass ({dp16.moe_passes.iloc[0]} per step, MTP included). The MoE
layer as npusim runs it, its largest launches (22 sequences x 4 query tokens per die, 16 experts per die, 44 rows
per expert):

{md(w4_layer)}

**The W4A8 grouped matmul is not where it hides.** SGLang's DeepEP path calls npu_grouped_matmul with INT8
activations, INT4 weights packed in int32, per-group uint64 scales and a bias (sglang python/sglang/srt/
hardware_backend/npu/quantization/fused_moe_method_npu.py, NPUW4A8Int8DynamicMoEMethod.apply_without_routing_weights
@ 007baab). ops-transformer's A8W4 MSD template (GMMA8W4MSDCompute) splits each INT8 row into two INT4 rows and runs
one Matmul Iterate per 256-deep quantisation group, each FIXPIPE-dequantised and atomically added into a GM
workspace. npusim runs INT4 weights as INT8 (optime.GEMM_SCHEMES, their bytes too). Priced from the chip's pipe
rates (section's `msd_gmm_us`, an estimate outside npusim's kernels):

{md(gmm.drop(columns=["moe_passes", "tokens_per_step"]))}

The same structure read against the in-sample W4A8C8 / W8A8C8 pairs of the V3.2 deployment (models.md §3.3, rows of
validation.md), which npusim now prices alike:

{md(deltas)}

{md(overhead)}

A per-Iterate set-up of {overhead.overhead_per_iterate_us.min():.2f}-{overhead.overhead_per_iterate_us.max():.2f} us beyond the pipes
(the Matmul API's SetTensorA / SetTensorB / SetQuantVector and the synchronous GetTensorC) reconciles the MSD
structure with both published changes (not fitted: the rows are models.md's, and the two disagree by 2x). At the
DP16 shape that gives {dp16_low:.0f}-{dp16_high:.0f} us for the two GEMMs against npusim's {dp16.npusim_us.sum():.0f}: at most
{max(0.0, dp16_high - dp16.npusim_us.sum()):.0f} us of the {w4_missing:.0f} us missing per MoE pass. A kernel of its own for the
MSD form would move the CRI W4A8C8 rows toward their published change (npusim's W4A8 now equals its W8A8) more than
the DP16 rows; it is not built here (no measured A8W4 kernel row to check it on).
Remaining candidates, none measured: the MLA attention over 4 query tokens x 128 heads (353 us, cube-bound in
npusim; no A3 row of FIA at MTP3 shapes), the small ops' in-network floors (kernel_validation.md's MSM-GAP in-network
rows are 13-50 % above npusim's), and SGLang's per-step host work between the draft and verify graphs (the
speculative worker's draft-extend pass is not in the step).

### 6c. CloudMatrix-Infer, 8 per NPU: the floors of a small step

One MoE layer at 4 sequences per die (one stream, all cores), what npusim spends beside the per-layer budget the
published step leaves:

{md(cmi_parts)}

The weights alone, at the HBM rate, take {cmi_parts.set_index(cmi_parts.columns[0]).us.iloc[2]:.0f} us of the {cmi_parts.us.iloc[-1]:.0f} us
budget, and the {cmi_parts.us.iloc[0]:.0f} kernels' graph launches (6 us each, fitted on the in-sample A3 rows)
another {cmi_parts.us.iloc[1]:.0f} us; with the two exchanges at their ~{cmi_parts.us.iloc[5] / 2:.0f} us floor (K01's setup at a few rows) there is
no room left for the kernels' own time. The in-network kernel rows do not support lower floors: every MSM-GAP pair
on an A3 die is slower inside the serving step than replayed (K124 1.8x, K193 2.1x, K195 2.0x), and npusim's
in-network predictions of them are already 13-50 % short. Either the row's 8-per-NPU reading (the paper's 538
tokens/s per NPU under 15 ms taken as 8 sequences per NPU at MTP1 0.7, through a secondary restatement) overstates
the batch, or the paper's decode runs below the in-graph floors every measured row shows; nothing in the references
tells which, and the row stays as it is.
"""
    (OUT / "decode_outliers.md").write_text(text)
    pd.concat([marg.assign(table="marginal"), terms.reset_index().assign(table="v32_terms"),
               sched.assign(table="cmi_schedules"), a3.assign(table="a3_kernels"),
               fused_tab.assign(table="fused_exchange"), gmm.assign(table="w4a8_gmm"),
               deltas.assign(table="w4a8_deltas"), overhead.assign(table="msd_iterate_overhead"),
               cmi_parts.assign(table="cmi_floor")],
              ignore_index=True).round(3).to_csv(OUT / "decode_outliers.csv", index=False)
    print(text)


if __name__ == "__main__":
    main()
