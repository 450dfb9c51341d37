"""Regenerate the serving validation table: npusim's predictions beside every published serving row it can express.

Run: python experiments/validate.py   -> experiments/results/validation.{csv,md}
Rows come from shared/reference/published.md (A15-A23) and the cann-recipes tables quoted in models.md §3.3.
`kind`: doc = a vendor-documented measurement; bound = an upper-bound claim ("TTFT < 2 s"), judged met / missed;
oos = OUT OF SAMPLE: a published deployment outside the calibration set (SGLang's Ascend best-practice runs,
CloudMatrix-Infer's R1 decode and prefill), never
used to fit anything, reported in its own section with its source. No parameter is fitted per row; errors are
reported as they come, good or bad. The outlier decode rows are taken apart op by op in
experiments/decode_outliers.py (results/decode_outliers.md).
"""

from __future__ import annotations

import math
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from npusim import api
from npusim.errors import NpusimError

OUT = Path(__file__).parent / "results"
MTP1 = {"plan.mtp.depth": "1", "plan.mtp.acceptance": "0.7"}
# Context of a decode step = keys the first new token sees; at 1M the MTP drafts must stay within the 1M positions.


def ranks(n: int) -> dict[str, str]:
    """A decode instance of n ranks, attention DP n + MoE EP n."""
    return {"plan.decode.ranks": str(n), "plan.decode.attention.dp": str(n), "plan.decode.moe.ep": str(n)}


@dataclass(frozen=True)
class Row:
    id: str
    what: str
    metric: str  # ttft | prefill | tpot
    published: float  # seconds
    kind: str  # doc | bound
    hw: str
    model: str
    plan: str
    quant: str
    input: int = 4096
    output: int = 1
    batch: int = 1
    prefill_batch: int = 1
    context: int | None = None
    overrides: dict[str, str] = field(default_factory=dict)
    source: str = ""


V32, V31, FLASH, PRO = "deepseek-v3.2-exp", "deepseek-v3.1", "deepseek-v4-flash", "deepseek-v4-pro"
CM, POD = "cloudmatrix384", "atlas-950-superpod"
# A15 without microbatches runs everything on one stream: the shared expert on the current stream in prefill and the
# double routing's all_to_all_single in order between the experts' kernels (cann-recipes-infer models/deepseek_r1/
# models/modeling_deepseek.py:465-491 and 681-726 @ fbc225d), so no collective overlaps compute
NO_MB = {"plan.streams.two_microbatch": "false", "plan.prefill.microbatches": "1", "plan.streams.comm_overlap": "false"}
# A17's "Prefill 64卡 + Decode 64卡" (cann-recipes-infer @ 8dd3a3b, the 0-day text of the BF16 claim:
# docs/models/deepseek-v3.2-exp/deepseek_v3.2_exp_inference_guide.md line 16): its decode config is world_size 128 = 64 chips
# (deepseek_v3.2_exp_rank_128_128ep_decode.yaml, "world_size = 2 * chip_num in A3"), so 卡 counts chips, and the guide
# sizes prefill at 4-8 nodes of 8 chips; the shipped prefill yaml (world_size 64, cp_size = world_size) is the 4-node
# 64K example (input_max_len 65536). Both prefill readings are rows: CP64 on 32 chips, CP128 on 64 chips.
CP128 = {"plan.prefill.ranks": "128", "plan.prefill.attention.cp": "128", "plan.prefill.moe.ep": "128"}
ROWS = [
    Row("A15", "R1 W8A8 prefill, 32 ranks, 64 x 4K, no microbatch", "prefill", 3.128, "doc", CM, V31,
        "r1-a3-prefill-a15", "w8a8", prefill_batch=64, overrides=NO_MB),
    Row("A15", "R1 W8A8 prefill, 32 ranks, 64 x 4K, 2 microbatches", "prefill", 2.512, "doc", CM, V31,
        "r1-a3-prefill-a15", "w8a8", prefill_batch=64),
    Row("A16", "R1 W8A8C8 decode, 128 ranks, batch 6144, MTP1", "tpot", 0.0449, "doc", CM, V31, "r1-a3-decode-a16",
        "w8a8c8", batch=6144, context=4096),
    Row("A17", "V3.2 BF16 TTFT at 128K, prefill CP64 (the shipped 32-chip prefill yaml)", "ttft", 2.0, "bound", CM,
        V32, "v32-a3-pd-a17", "bf16", input=131072),
    Row("A17", "V3.2 BF16 TTFT at 128K, prefill CP128 ('Prefill 64卡' as 64 chips)", "ttft", 2.0, "bound", CM, V32,
        "v32-a3-pd-a17", "bf16", input=131072, overrides=CP128),
    # The BF16 decode benchmark config runs MTP1 (next_n: 1 in cann-recipes models/deepseek_v3_2_exp/config/
    # deepseek_v3.2_exp_rank_128_128ep_decode_benchmark.yaml); its acceptance is not published for V3.2 (estimate:
    # 0.7, the MTP1 acceptance of A16 and A23).
    Row("A17", "V3.2 BF16 TPOT at 128K, decode DP128+EP128, batch 256, MTP1", "tpot", 0.030, "bound", CM, V32,
        "v32-a3-pd-a17", "bf16", input=131072, batch=256, context=131072, overrides=MTP1),
    Row("A17", "V3.2 W8A8C8 TPOT at 128K, MTP3, batch 256", "tpot", 0.020, "bound", CM, V32,
        "v32-a3-decode-w8a8c8-mtp3", "w8a8c8", batch=256, context=131072),
    *[Row(i, f"V3.2 W8A8C8 decode 128 ranks, MTP3, {c // 1024}K, batch {b}", "tpot", t, "doc", CM, V32,
          "v32-a3-decode-w8a8c8-mtp3", "w8a8c8", batch=b, context=c)
      for i, c, b, t in (("A18", 65536, 256, 0.01984), ("A19", 65536, 512, 0.02278), ("A20", 131072, 128, 0.01885),
                         ("A21", 131072, 512, 0.0258))],
    *[Row("CRI", f"V3.2 {q.upper()} decode {n} ranks, MTP3, 64K, batch {b}", "tpot", t, "doc", CM, V32,
          "v32-a3-decode-w8a8c8-mtp3", q, batch=b, context=65536, overrides=ranks(n))
      for n, b, q, t in ((64, 64, "w8a8c8", 0.02081), (64, 64, "w4a8c8", 0.02018), (32, 32, "w8a8c8", 0.02439),
                         (32, 32, "w4a8c8", 0.02251))],
    *[Row("A23", f"V4-Flash 16 x 950DT, 8K, batch {b}, MTP{m}", "tpot", t, "doc", POD, FLASH, "v4flash-950dt-a23",
          "mxfp8-mxfp4", batch=b, context=8192, overrides=MTP1 if m == 1 else {})
      for b, m, t in ((16, 3, 0.00655), (256, 3, 0.00878), (1536, 1, 0.01646), (2880, 1, 0.02554))],
    *[Row("CRI", f"V4-Flash 16 x 950DT, {c // 1024}K, batch {b}", "tpot", t, "doc", POD, FLASH, "v4flash-950dt-a23",
          "mxfp8-mxfp4", batch=b, context=min(c, 1048576 - 3), overrides=MTP1 if b > 256 else {})
      for c, b, t in ((131072, 256, 0.00966), (131072, 768, 0.01050), (1048576, 16, 0.00804), (1048576, 64, 0.00946))],
    *[Row("CRI", f"V4-Pro 16 x 950DT, {c // 1024}K, batch {b}", "tpot", t, "doc", POD, PRO, "v4pro-950dt",
          "mxfp8-mxfp4", batch=b, context=c)
      for c, b, t in ((8192, 16, 0.01764), (8192, 128, 0.02061), (131072, 16, 0.01946), (131072, 64, 0.02123))],
    *[Row("CRI", f"V4-Flash W8A8 on A3, 128 ranks, 8K, batch {b}, MTP1", "tpot", t, "doc", CM, FLASH,
          "v4flash-a3-decode", "w8a8", batch=b, context=8192)
      for b, t in ((7168, 0.02782), (8192, 0.02917))],
]


# ---------------------------------------------------------------------------------------------- out of sample
SGLANG = ("sgl-project/sglang docs/platforms/ascend_npu_best_practice.md: TPOT / Output TPS table and the bench_serving "
          "log of each run (accept length, mean concurrency, TTFT, E2E)")


CMI = ("arXiv 2506.12708 (CloudMatrix-Infer, Zuo et al. 2025), abstract and decode / prefill evaluation: DeepSeek-R1 "
       "INT8, decode EP320 at 1,943 tokens/s per NPU with TPOT < 50 ms (96 sequences per NPU: 96 / 1,943 = 49.4 ms) and "
       "538 tokens/s per NPU under 15 ms (8 per NPU: 538 x 0.015 = 8.1; a secondary restatement of the paper's decode "
       "results says the batch is cut from 96 to 8 per NPU for that SLO), prefill 6,688 tokens/s per NPU; "
       "decode as two microbatches on 16 + 8 AIC. "
       "Not stated there, taken from A16 / A15 (estimate): MTP1 accepting 0.7, 4K context, prefill as A15's 64 x 4K "
       "on 32 dies with two microbatches; the shared and redundant experts' own dies are 64 redundant routed experts")
CMI_DECODE = {"plan.decode.ranks": "320", "plan.decode.attention.dp": "320", "plan.decode.moe.ep": "320",
              "plan.eplb.redundant_experts": "64", "plan.streams.two_microbatch": "true",
              "plan.streams.attention_cores": "16"}


def decoding(concurrency: float, ttft: float, e2e: float, dp: int) -> int:
    """Global decode batch of a bench_serving run: the mean concurrency times the share of a request's life spent
    decoding (1 - TTFT/E2E), on the busiest DP rank (rounded up), times the DP ranks."""
    return dp * math.ceil(concurrency * (1.0 - ttft / e2e) / dp)


def accept(length: float) -> dict[str, str]:
    """MTP acceptance from the run's published accept length (tokens per step, the verified token included)."""
    return {"plan.mtp.acceptance": f"{length - 1:.2f}"}


OUT_OF_SAMPLE = [
    *[Row("SGL", f"R1 W8A8 SGLang PD, decode DP16 x TP2 + EP32, MTP3, {name}", "tpot", t, "oos", CM, V31,
          "r1-a3-sglang-pd-tp2", "w8a8", batch=decoding(conc, ttft, e2e, 16), context=i + o // 2,
          overrides=accept(acc), source=SGLANG)
      for name, i, o, t, acc, conc, ttft, e2e in (
          ("6K+1.6K", 6000, 1600, 0.01981, 2.59, 27.19, 5.149, 36.922),
          ("3.9K+1K", 3900, 1000, 0.01977, 2.88, 25.82, 2.902, 22.651),
          ("3.5K+1.5K", 3500, 1500, 0.01992, 2.84, 25.66, 2.672, 32.526),
          ("3.5K+1K", 3500, 1000, 0.01952, 2.84, 25.78, 2.655, 22.155))],
    # the log generated 196,608 tokens over its 64 requests, 3,072 each (its bench command says 1,000)
    Row("SGL", "V3.2 W8A8 SGLang PD, decode DP8 x TP4 + EP32, MTP3, 64K+3K", "tpot", 0.02536, "oos", CM, V32,
        "v32-a3-sglang-pd-tp4", "w8a8-modelslim", batch=decoding(17.99, 39.313, 117.181, 8), context=64000 + 1536,
        overrides=accept(3.18), source=SGLANG),
    *[Row("SGL", f"R1 W4A8 SGLang PD, decode DP16 + EP16, MTP3, {name}", "tpot", t, "oos", CM, V31,
          "r1-a3-sglang-pd-w4a8", "w4a8", batch=decoding(conc, ttft, e2e, 16), context=i + o // 2,
          overrides=accept(acc), source=SGLANG)
      for name, i, o, t, acc, conc, ttft, e2e in (
          ("2K+2K", 2048, 2048, 0.04776, 2.86, 363.54, 5.139, 102.896),
          ("3.5K+1.5K", 3500, 1500, 0.04943, 2.87, 323.46, 9.784, 83.872))],
    *[Row("CMI", f"R1 INT8 CloudMatrix-Infer decode, 320 dies DP320 + EP320, MTP1, {b} per NPU, 2 microbatches "
          "on 16+8 AIC", "tpot", t, "oos", CM, V31, "r1-a3-decode-a16", "w8a8", batch=b * 160, context=4096,
          overrides=CMI_DECODE, source=CMI)
      for b, t in ((96, 96 / 1943), (8, 8 / 538))],
    Row("CMI", "R1 INT8 CloudMatrix-Infer prefill, 6,688 tokens/s per NPU (64 x 4K on 32 dies, 2 microbatches)",
        "prefill", 64 * 4096 / (6688 * 16), "oos", CM, V31, "r1-a3-prefill-a15", "w8a8", prefill_batch=64, source=CMI),
]


def evaluate(row: Row) -> dict:
    out = {"id": row.id, "row": row.what, "metric": row.metric, "kind": row.kind, "published_ms": row.published * 1e3,
           "hw": row.hw, "model": row.model, "plan": row.plan, "quant": row.quant, "input": row.input,
           "batch": row.batch}  # the configuration, so that a report can find the rows closest to its own
    try:
        p = api.predict(row.hw, row.model, row.plan, input=row.input, output=row.output, batch=row.batch,
                        prefill_batch=row.prefill_batch, context=row.context, quant=row.quant,
                        overrides=row.overrides)
    except NpusimError as exc:
        return out | {"predicted_ms": float("nan"), "error_%": float("nan"), "note": f"refused: {exc}"}
    except Exception as exc:  # a bug must show in the table, not hide the other rows
        traceback.print_exc(file=sys.stderr)
        return out | {"predicted_ms": float("nan"), "error_%": float("nan"), "note": f"crash: {exc!r}"}
    value = p.tpot if row.metric == "tpot" else p.ttft if row.metric == "ttft" else p.prefill.time
    err = 100 * (value - row.published) / row.published
    note = ("met" if value <= row.published else "missed") if row.kind == "bound" else ""
    return out | {"predicted_ms": value * 1e3, "error_%": err, "note": note}


CONFIG = ["hw", "model", "plan", "quant", "input", "batch"]  # in the CSV, not in the markdown tables


def table(rows: list[Row] = ROWS) -> pd.DataFrame:
    return pd.DataFrame([evaluate(r) for r in rows])


def summary(frame: pd.DataFrame, kind: str = "doc") -> str:
    doc = frame[(frame.kind == kind) & frame["error_%"].notna()]
    err = doc["error_%"].abs()
    bounds = frame[frame.kind == "bound"]
    failed = frame["error_%"].isna().sum()
    label = "documented rows" if kind == "doc" else "out-of-sample rows (never fitted)"
    text = (f"{len(doc)} {label}: median |error| {err.median():.1f} %, worst {err.max():.1f} % "
            f"({doc.loc[err.idxmax(), 'row'] if len(doc) else '-'}); within 15 %: {(err <= 15).sum()} of {len(doc)}.")
    if kind == "doc":
        text += f" Bounds met: {(bounds.note == 'met').sum()} of {len(bounds)}."
    return text + f" Rows not predicted: {failed}."


def main() -> None:
    OUT.mkdir(exist_ok=True)
    frame, oos = table(), table(OUT_OF_SAMPLE)
    oos["source"] = [r.source for r in OUT_OF_SAMPLE]
    both = pd.concat([frame.assign(set="in-sample"), oos.assign(set="out-of-sample")], ignore_index=True)
    both.round({"published_ms": 3, "predicted_ms": 3, "error_%": 1}).to_csv(OUT / "validation.csv", index=False)
    text, oos_text = summary(frame), summary(oos, "oos")
    frame, oos = frame.drop(columns=CONFIG), oos.drop(columns=CONFIG)
    (OUT / "validation.md").write_text(
        "# Serving validation: predicted vs published\n\n" + frame.round(2).to_markdown(index=False) + "\n\n" + text
        + "\n\n## Out of sample (reported, never fitted)\n\nPublished deployments outside the calibration set. "
        + "Sources: " + "; ".join(f"{r.id}: {r.source}" for r in {r.id: r for r in OUT_OF_SAMPLE}.values()) + ".\n\n"
        + oos.drop(columns="source").round(2).to_markdown(index=False)
        + "\n\n" + oos_text + "\n")
    print(frame.round(2).to_string(index=False))
    print(text)
    print(oos.drop(columns="source").round(2).to_string(index=False))
    print(oos_text)


if __name__ == "__main__":
    main()
