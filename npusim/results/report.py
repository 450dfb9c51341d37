"""One self-contained HTML report of a prediction, a planned deployment or a sweep (`npusim report`).

The page has no external resource: styles inline, figures as inline SVG (matplotlib's SVG writer, or drawn here for
the timeline), so it opens from a mail attachment or a CI artefact. It shows the headline (TTFT, TPOT, tokens/s per
chip, $ per million tokens, J/token), memory per rank, the per-op breakdown with each op's bound and roofline, the
timeline of one decode step's layers (the Perfetto JSON of the same timeline is written beside the page), the
validation status of the published rows whose configuration is closest to this one
(`experiments/results/validation.csv`), and for a plan the search's frontier and runners-up. Key numbers carry
element ids (`ttft_ms`, `tpot_ms`, ...) so that a test or a script can read them from the DOM.

Limits: the timeline is one layer of each type of the decode step (a step repeats them); closeness to a validation
row is by shared plan, model, system and quantisation, not by a distance in lengths.
"""

from __future__ import annotations

import html
import io
from dataclasses import dataclass

import pandas as pd

from npusim.results.cost import Cost, CostParams
from npusim.results.prediction import Prediction

CSS = """
body{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:1200px}
h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #ccc;padding-bottom:4px;margin-top:28px}
table{border-collapse:collapse;font-size:12px;margin:8px 0}td,th{border:1px solid #ddd;padding:3px 6px;text-align:right}
th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}
.cards{display:flex;flex-wrap:wrap;gap:10px}.card{border:1px solid #ccc;border-radius:6px;padding:10px 14px;min-width:150px}
.card .v{font-size:22px;font-weight:600}.card .k{font-size:12px;color:#555}.note{color:#555;font-size:12px}
.ok{color:#176e2c}.bad{color:#a8251c}
"""
VALIDATION = "experiments/results/validation.csv"


@dataclass(frozen=True)
class Section:
    title: str
    body: str


def page(title: str, subtitle: str, sections: list[Section]) -> str:
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{CSS}</style>"
             f"</head><body><h1>{_e(title)}</h1><p class='note'>{_e(subtitle)}</p>"]
    parts += [f"<h2>{_e(s.title)}</h2>{s.body}" for s in sections]
    return "".join(parts) + "</body></html>\n"


# CJK words of the sources' row names, transliterated (pinyin, then the meaning): the page names no font, and a browser
# without a CJK font (a CI image, a headless Chromium) would draw boxes. Any other CJK character is written U+XXXX.
TRANSLITERATION = {"卡": " ka (cards)"}


def latin(text: str) -> str:
    """`text` with its CJK characters transliterated (`TRANSLITERATION`), or as their code points."""
    return "".join(TRANSLITERATION.get(ch, f"U+{ord(ch):04X}" if _cjk(ch) else ch) for ch in text)


def _cjk(ch: str) -> bool:
    """CJK ideographs, kana, hangul and CJK punctuation / full-width forms."""
    o = ord(ch)
    return (0x2E80 <= o <= 0x9FFF or 0xAC00 <= o <= 0xD7AF or 0xF900 <= o <= 0xFAFF or 0xFF00 <= o <= 0xFFEF
            or 0x20000 <= o <= 0x3134F)


def _e(text) -> str:
    return html.escape(latin(str(text)))


def table(frame: pd.DataFrame, digits: int = 2) -> str:
    if frame.empty:
        return "<p class='note'>(none)</p>"
    shown = frame.round(digits)
    for col in shown.columns:
        if not pd.api.types.is_numeric_dtype(shown[col]):
            shown[col] = shown[col].map(lambda v: latin(v) if isinstance(v, str) else v)
    return shown.to_html(index=False, border=0, na_rep="-", escape=True)


def svg_figure(fig) -> str:
    """A matplotlib figure as inline SVG (closed afterwards)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ------------------------------------------------------------------------------------------------- sections

def headline(pred: Prediction, price: Cost) -> Section:
    pre = pred.prefill is not None  # a decode-only plan has no prefill figures
    cards = [("ttft_ms", "TTFT", pred.ttft * 1e3 if pre else None, "ms"), ("tpot_ms", "TPOT", pred.tpot * 1e3, "ms"),
             ("decode_tok_s_chip", "decode tokens/s per chip", pred.tokens_per_s_per_chip, ""),
             ("prefill_tok_s_chip", "prefill tokens/s per chip", pred.prefill_tokens_per_s_per_chip, ""),
             ("decode_usd_per_mtok", "$ per million output tokens", price.decode_usd_per_mtok, ""),
             ("prefill_usd_per_mtok", "$ per million prompt tokens", price.prefill_usd_per_mtok if pre else None, ""),
             ("decode_system_j_per_token", "system J per output token", price.decode_system_joules_per_token, ""),
             ("chips", "chips (prefill + decode)", pred.prefill_chips + pred.decode_chips, "")]
    cards = [c for c in cards if c[2] is not None]
    if pred.joules_per_token:
        cards.append(("decode_chip_j_per_token", "chip J per output token (activity)", pred.joules_per_token["decode"],
                      ""))
    body = "<div class='cards'>" + "".join(
        f"<div class='card'><div class='v'><span id='{k}'>{v:.4g}</span> {u}</div><div class='k'>{_e(label)}</div>"
        f"</div>" for k, label, v, u in cards) + "</div>"
    s = pred.scenario
    ttft = (f"TTFT = prefill {pred.prefill.time * 1e3:.1f} ms + KV transfer {pred.kv_transfer * 1e3:.1f} ms"
            if pre else "; ".join(pred.notes))
    body += (f"<p class='note'>{_e(ttft)}; TPOT = decode step {pred.decode_step * 1e3:.2f} ms / accepted tokens. "
             f"Input {s['input']}, output {s['output']}, decode batch {s['batch']} at context {s['context']}, prefill "
             f"batch {s['prefill_batch']}. Cost at {_e(CostParams().describe())}.</p>")
    return Section("Headline", body)


def memory(pred: Prediction) -> Section:
    frame = pred.phase_table()
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 2.4))
    left = [0.0] * len(frame)
    for col, colour in (("weights_GiB", "#4c72b0"), ("kv_GiB", "#dd8452"), ("activations_GiB", "#55a868"),
                        ("comm_buffers_GiB", "#8172b3")):
        ax.barh(frame["phase"], frame[col], left=left, color=colour, label=col.replace("_GiB", ""))
        left = [a + b for a, b in zip(left, frame[col])]
    ax.plot(frame["usable_GiB"], frame["phase"], "k|", markersize=22, label="usable")
    ax.set_xlabel("GiB per rank")
    ax.legend(fontsize=7, ncol=5, loc="lower center", bbox_to_anchor=(0.5, 1.0))
    mem = frame[["phase", "weights_GiB", "kv_GiB", "activations_GiB", "comm_buffers_GiB", "total_GiB", "usable_GiB"]]
    return Section("Memory per rank", table(mem) + svg_figure(fig))


def breakdown(pred: Prediction, top: int = 15) -> Section:
    body = ""
    plt = _plt()
    fig, axes = plt.subplots(1, len(pred.phases), figsize=(5 * len(pred.phases), 3), squeeze=False)
    for ax, phase in zip(axes[0], pred.phases):
        frame = pred.breakdown(phase)
        by_kind = frame.groupby("kind")["total_ms"].sum().sort_values()
        ax.barh(by_kind.index.astype(str), by_kind.values, color="#4c72b0")
        ax.set_title(f"{phase}: ms per step by kind", fontsize=9)
        ax.tick_params(labelsize=7)
        shown = frame.sort_values("total_ms", ascending=False).head(top)[
            ["layer", "x", "op", "kind", "per_call_us", "total_ms", "share_pct", "bound", "roofline_us"]]
        body += f"<h3>{phase}: top {top} ops and collectives by total time</h3>" + table(shown)
    return Section("Where the time goes (per op, with its bound and roofline)", svg_figure(fig) + body)


def timeline_svg(trace: dict, phase_prefix: str = "decode", width: int = 1100) -> str:
    """The Perfetto trace's spans of one phase drawn as lanes: one band per layer type, one lane per stream."""
    events = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    pids = [p for p, n in names.items() if n.startswith(phase_prefix)]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("name") == "thread_name"}
    spans = [e for e in events if e.get("ph") == "X" and e["pid"] in pids]
    if not spans:
        return "<p class='note'>(no timeline)</p>"
    colours = ["#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3", "#8c8c8c"]
    cats = sorted({e.get("cat", "") for e in spans})
    lane_h, label_w, rows, y = 16, 230, [], 0
    out = []
    for pid in pids:
        mine = [e for e in spans if e["pid"] == pid]
        t0 = min(e["ts"] for e in mine)
        t1 = max(e["ts"] + e["dur"] for e in mine)
        scale = (width - label_w - 10) / max(t1 - t0, 1e-9)
        out.append(f"<text x='2' y='{y + 12}' font-size='11' font-weight='bold'>{_e(names[pid])}: "
                   f"{(t1 - t0) / 1e3:.3f} ms</text>")
        y += lane_h
        for tid in sorted({e["tid"] for e in mine}):
            out.append(f"<text x='12' y='{y + 11}' font-size='10'>{_e(threads.get((pid, tid), tid))}</text>")
            for e in (e for e in mine if e["tid"] == tid):
                x = label_w + (e["ts"] - t0) * scale
                w = max(e["dur"] * scale, 0.5)
                c = colours[cats.index(e.get("cat", "")) % len(colours)]
                out.append(f"<rect x='{x:.1f}' y='{y}' width='{w:.1f}' height='{lane_h - 3}' fill='{c}'>"
                           f"<title>{_e(e['name'])}: {e['dur']:.1f} us</title></rect>")
            y += lane_h
        rows.append(y)
        y += 6
    legend = "".join(f"<tspan fill='{colours[i % len(colours)]}'>&#9632; {_e(c or 'other')}  </tspan>"
                     for i, c in enumerate(cats))
    out.append(f"<text x='2' y='{y + 12}' font-size='10'>{legend}</text>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{y + 20}' id='timeline'>"
            + "".join(out) + "</svg>")


def timeline(pred: Prediction, trace_file: str) -> Section:
    body = timeline_svg(pred.chrome_trace())
    body += (f"<p class='note'>One layer of each type of the decode step, every stream a lane (hover a span for its "
             f"name and time). The same timeline with the prefill layers, for Perfetto (ui.perfetto.dev) or "
             f"chrome://tracing: <a href='{_e(trace_file)}'>{_e(trace_file)}</a>.</p>")
    return Section("Timeline of one decode step", body)


def closest_validation(frame: pd.DataFrame | None, hw: str, model: str, plan: str, quant: str, n: int = 8) -> Section:
    """The published rows of the validation table sharing most of this configuration (plan 4, model 2, system 1,
    quantisation 1), with their error."""
    if frame is None or frame.empty or "plan" not in frame:
        return Section("Validation status of the closest published rows",
                       f"<p class='note'>No validation table with configurations found ({VALIDATION}; regenerate it "
                       "with python experiments/validate.py).</p>")
    score = (4 * (frame["plan"] == plan) + 2 * (frame["model"] == model) + (frame["hw"] == hw)
             + (frame["quant"] == quant))
    near = frame.assign(shared=score)[score > 0].sort_values(["shared", "id"], ascending=[False, True]).head(n)
    bound = (near["kind"] == "bound") if "kind" in near else pd.Series(False, index=near.index)
    # an SLO bound row (a published limit the deployment meets, not a measured time) has no error: met or missed
    near = near.assign(**{"error_%": near["error_%"].where(~bound), "bound": [
        (f"{'met' if p <= b else 'missed'}: {p:.0f} ms against the published bound {b:.0f} ms" if is_bound else "")
        for p, b, is_bound in zip(near["predicted_ms"], near["published_ms"], bound)]})
    shown = near[["id", "row", "metric", "published_ms", "predicted_ms", "error_%", "bound", "set", "plan", "model",
                  "hw", "quant", "shared"]]
    err = near.loc[~bound, "error_%"].abs()
    bounds = f" ({int(bound.sum())} of them SLO bounds, met or missed, not errors)" if bound.any() else ""
    summary = (f"<p class='note'>{len(near)} rows share this configuration's plan (4), model (2), system (1) or "
               f"quantisation (1){bounds}; the median |error| of the measured ones is <span "
               f"id='validation_median_abs_error_pct'>{err.median():.1f}</span> %.</p>" if len(err) else
               f"<p class='note'>{len(near)} rows share this configuration{bounds}; none is a measured time.</p>"
               if len(near) else "<p class='note'>No published row shares this plan, model, system or "
               "quantisation.</p>")
    return Section("Validation status of the closest published rows", summary + table(shown, 1))


def frontier_figure(front: pd.DataFrame, colocated: pd.DataFrame | None = None, verdict: str = ""):
    """The disaggregated frontier (one request each) and the deployments served beside it with `npusim plan
    --colocated` in one figure: served tokens/s per chip against TPOT, the served runs at their percentile (those
    the one-request bound pruned have no served figures and are not drawn); `verdict` as the title."""
    fig, ax = _plt().subplots(figsize=(6, 3.2))
    # a frontier in three figures (tokens/s per chip, TPOT, chips): its points, not a curve in these two
    ax.plot(front["tpot_ms"], front["served_tok_s_chip"], "o", color="#4c72b0",
            label="disaggregated frontier (one request)")
    for _, r in front.iterrows():
        ax.annotate(f"{r['chips']:g} chips", (r["tpot_ms"], r["served_tok_s_chip"]), fontsize=7)
    if colocated is not None and not colocated.empty:
        tpot = next(c for c in colocated if c.startswith("tpot_"))
        for kind, marker, colour in (("co-located", "s", "#dd8452"), ("disaggregated", "^", "#55a868")):
            rows = colocated[(colocated["deployment"] == kind) & (colocated["served_tok_s_chip"] > 0)]
            if rows.empty:  # e.g. every co-located layout pruned by its prompt alone
                continue
            ax.plot(rows[tpot], rows["served_tok_s_chip"], marker, color=colour, linestyle="none",
                    label=f"{kind}, served ({tpot.split('_')[1]})")
    ax.set(xlabel="TPOT (ms)", ylabel="served tokens/s per chip", title=verdict or "Pareto frontier")
    ax.title.set_fontsize(7 if verdict else 10)
    ax.title.set_wrap(True)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return fig


def frontier(front: pd.DataFrame, served: pd.DataFrame, colocated: pd.DataFrame | None = None,
             verdict: str = "") -> Section:
    """The search's frontier (and, with `npusim plan --colocated`, the co-located deployments served beside the
    disaggregated recommendation) in one figure of served tokens/s per chip against TPOT, then the tables."""
    body = ""
    if not front.empty and {"tpot_ms", "served_tok_s_chip"} <= set(front):
        body += svg_figure(frontier_figure(front, colocated))
    body += table(front)
    if colocated is not None and not colocated.empty:
        body += (f"<h3>Co-located vs disaggregated, served</h3><p id='verdict'>{_e(verdict)}</p>"
                 + table(colocated))
    if not served.empty:
        body += "<h3>Runners-up (served under the load, or the closest candidates)</h3>" + table(served)
    return Section("Frontier and runners-up of the search", body)


def prediction_sections(pred: Prediction, price: Cost, trace_file: str, validation: pd.DataFrame | None) -> list:
    return [headline(pred, price), memory(pred), breakdown(pred), timeline(pred, trace_file),
            closest_validation(validation, pred.system, pred.model, pred.plan, pred.quant)]


def sweep_sections(frame: pd.DataFrame, spec) -> list[Section]:
    """The sweep's points (the figures that apply, then the table): a refused point keeps its reason."""
    from npusim.sweeps import figures

    ok = frame[frame["error"] == ""] if "error" in frame else frame
    figs = [f(ok, spec) for f in (figures.tpot_vs_batch, figures.ttft_vs_context, figures.tokens_vs_chips,
                                   figures.roofline)] if not ok.empty else []
    body = "".join(svg_figure(f) for f in figs if f is not None)
    cols = [c for c in frame.columns if c in set(spec.grid) | {k for p in spec.points for k in p}]
    cols += [c for c in ("ttft_s", "tpot_s", "decode_tokens_per_s_per_chip", "decode_usd_per_mtok", "chips", "error")
             if c in frame]
    best = ok.loc[ok["decode_tokens_per_s_per_chip"].idxmax()] if len(ok) else None
    head = (f"<p>{len(frame)} points, {len(ok)} predicted; the most decode tokens/s per chip: "
            f"<span id='best_decode_tok_s_chip'>{best['decode_tokens_per_s_per_chip']:.4g}</span> at "
            f"{_e(', '.join(f'{k}={best[k]}' for k in cols if k in spec.grid))}.</p>" if best is not None else
            "<p>No point could be predicted.</p>")
    return [Section(f"Sweep {spec.name}", head + body + table(frame[cols], 4))]
