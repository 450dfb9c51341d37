"""`npusim model`: list the model files and show one model's op graph for a phase and scenario."""

from __future__ import annotations

from typing import TYPE_CHECKING

from npusim.cli import common
from npusim.cli.defaults import PHASES
from npusim.spec.model import load_model, model_names
from npusim.spec.quant import PRESETS, get_quant

if TYPE_CHECKING:  # pandas and the graph builder load in the commands, so that every --help stays light
    from npusim.graph.ops import LayerGraph, ModelGraph


def register(sub) -> None:
    model = sub.add_parser("model", help="model workloads: configs, accounting and op graphs")
    cmds = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)

    p = cmds.add_parser("list", help="model files with parameters, activated parameters and cache per token")
    common.add_format(p)
    p.set_defaults(run=run_list)

    p = cmds.add_parser("show", help="the op table of one prefill or decode step, with per-layer and model totals")
    p.add_argument("name", help="model name (see 'npusim model list'), a YAML path or a Hugging Face config.json")
    p.add_argument("--phase", choices=PHASES, default="decode")
    p.add_argument("--context", type=int, default=4096,
                   help="decode: keys the first new token sees, itself included (default 4096)")
    p.add_argument("--seq-len", type=int, default=None, help="prefill: prompt tokens per sequence (default --context)")
    p.add_argument("--batch", type=int, default=1, help="sequences in the step (default 1)")
    p.add_argument("--mtp", type=int, default=0, help="MTP draft tokens per sequence (default 0)")
    p.add_argument("--quant", default=None, help=f"quantisation preset ({', '.join(PRESETS)}; default: the model's)")
    p.add_argument("--verbose", action="store_true",
                   help="for a config.json: its architecture and the keys ignored (they do not change cost)")
    common.add_set(p)
    common.add_format(p)
    p.set_defaults(run=run_show)


def run_list(args) -> None:
    import pandas as pd

    from npusim.graph.accounting import cache_footprint, parameters

    records = []
    for name, kind in [(n, "built-in") for n in model_names()] + [(c, "HF config") for c in shipped_configs()]:
        m = load_model(name)
        params = parameters(m)
        cache = cache_footprint(m, get_quant(m.default_quant))
        records.append({"name": name, "kind": kind, "model_type": m.model_type, "layers": m.num_hidden_layers,
                        "hidden": m.hidden_size, "params (B)": round(params.total / 1e9, 1),
                        "activated (B)": round(params.activated / 1e9, 2), "quant": m.default_quant,
                        "cache B/token": round(cache.bytes_per_token),
                        "description": m.description if kind == "built-in" else _config_description(m)})
    common.emit(pd.DataFrame(records), args.format)


def shipped_configs() -> list[str]:
    """The Hugging Face config.json files that ship (workloads/models/hf/<model>/config.json; drafts/ holds EAGLE-3
    draft models, which are not models to serve), as paths `--model` takes from here (relative below the working
    directory, else absolute)."""
    from pathlib import Path

    from npusim.spec.catalog import data_root

    here = Path.cwd().resolve()
    paths = sorted((data_root() / "workloads" / "models" / "hf").resolve().glob("*/config.json"))
    return [str(p.relative_to(here)) if p.is_relative_to(here) else str(p) for p in paths]


def _config_description(model) -> str:
    return f"Hugging Face config.json, model_type {model.source_model_type} (npusim family {model.model_type})"


def config_mapping(model) -> dict[str, str]:
    """How a Hugging Face config.json became the model (empty for npusim's own YAML files)."""
    if not model.source_model_type:
        return {}
    return {"config model_type": f"{model.source_model_type} (npusim family {model.model_type})",
            "ignored config keys (no effect on cost)": ", ".join(model.ignored) or "none",
            "config keys at the value npusim models": ", ".join(model.checked) or "none"}


def _shape(shape: dict[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in shape.items())


def _rows(layer: LayerGraph) -> list[dict]:
    label = f"{layer.name} x{layer.repeat}" if layer.repeat > 1 else layer.name
    rows = [{"layer": label, "op": op.name, "kernel": op.kind, "unit": op.unit, "shape": _shape(op.shape),
             "dtypes": ",".join(f"{k}:{v}" for k, v in op.dtypes.items()), "GFLOP": op.flops / 1e9,
             "MB read": op.bytes_read / 1e6, "MB written": op.bytes_written / 1e6,
             "FLOP/B": op.arithmetic_intensity} for op in layer.ops]
    total = layer.bytes_read + layer.bytes_written
    rows.append({"layer": label, "op": "= per layer", "kernel": "", "unit": "", "shape": "", "dtypes": "",
                 "GFLOP": layer.flops / 1e9, "MB read": layer.bytes_read / 1e6,
                 "MB written": layer.bytes_written / 1e6, "FLOP/B": layer.flops / total if total else 0.0})
    return rows


def _totals(graph: ModelGraph) -> dict:
    return {"total GFLOP": round(graph.flops / 1e9, 3), "total MB read": round(graph.bytes_read / 1e6, 3),
            "total MB written": round(graph.bytes_written / 1e6, 3), "weight MB read": round(graph.weight_bytes / 1e6, 3),
            "FLOP/B": round(graph.arithmetic_intensity, 3)}


def run_show(args) -> None:
    import pandas as pd

    from npusim.graph import build_graph

    model = load_model(args.name, common.parse_overrides(args.overrides))
    length = args.seq_len if args.phase == "prefill" and args.seq_len is not None else args.context
    graph = build_graph(model, args.phase, args.batch, length, mtp_tokens=args.mtp, quant=args.quant)
    frame = pd.DataFrame([row for layer in graph.layers for row in _rows(layer)])
    scenario = " ".join(f"{k}={v}" for k, v in graph.scenario.items())
    title = f"{graph.model} {graph.phase} ({scenario}, quant {graph.quant})"
    if args.format == "table":
        for col in ("GFLOP", "MB read", "MB written", "FLOP/B"):
            frame[col] = frame[col].map(lambda v: f"{v:.4g}")
    extra = {"scenario": graph.scenario, "quant": graph.quant, **_totals(graph)}
    if args.verbose:
        extra |= config_mapping(model)
    common.emit(frame, args.format, title=title, extra=extra)
