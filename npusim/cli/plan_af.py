"""`npusim plan-af`: size the two sides of an attention-FFN disaggregated decode instance at a rank count and write
the fastest split as a plan file (npusim.planner.af)."""

from __future__ import annotations

from pathlib import Path

import yaml

from npusim.cli import common
from npusim.cli.defaults import SCENARIO
from npusim.cli.plan import _ints
from npusim.errors import NpusimError


def register(sub) -> None:
    p = sub.add_parser("plan-af", help="split a decode instance's ranks into attention and expert dies "
                                       "(attention-FFN disaggregation): every split, the fastest written as a plan")
    p.add_argument("--model", default=SCENARIO["model"], help="model name or HF config.json")
    p.add_argument("--hw", default=SCENARIO["hw"], help="system")
    p.add_argument("--plan", default=SCENARIO["plan"],
                   help="plan whose decode instance is laid out as AF (MTP, EPLB, streams and kernels are kept)")
    p.add_argument("--ranks", type=int, required=True, help="decode ranks to split (attention + expert dies)")
    p.add_argument("--batch", type=int, default=SCENARIO["batch"], help="global decode batch")
    p.add_argument("--context", type=int, default=4096, help="keys the first new token sees (default 4096)")
    p.add_argument("--quant", default=SCENARIO["quant"], help="quantisation preset ('model' = checkpoint format)")
    p.add_argument("--microbatches", default="1,2,3", help="microbatches per attention domain to try (default 1,2,3)")
    p.add_argument("--domains", default="1,2,3", help="attention domain counts to try (default 1,2,3)")
    p.add_argument("--top", type=int, default=10, help="splits to print (table format)")
    p.add_argument("--out", default="af-plan.yaml", help="where to write the fastest split (default af-plan.yaml)")
    common.add_set(p)
    common.add_format(p)
    p.set_defaults(run=run)


def run(args) -> None:
    import pandas as pd

    from npusim import api
    from npusim.planner.af import size_af

    for name, value, low in (("--ranks", args.ranks, 2), ("--batch", args.batch, 1), ("--context", args.context, 1)):
        if value < low:
            raise NpusimError(f"must be at least {low}, got {value}", field=name)
    micro, domains = _ints(args.microbatches, "--microbatches"), _ints(args.domains, "--domains")
    for name, values in (("--microbatches", micro), ("--domains", domains)):
        if not values or min(values) < 1:
            raise NpusimError(f"needs whole numbers >= 1, got '{','.join(map(str, values))}'", field=name)
    quant = None if args.quant == "model" else args.quant
    setup = api.load_setup(args.hw, args.model, args.plan, quant, common.parse_overrides(args.overrides))
    splits = size_af(setup.model, setup.plan, setup.system, ranks=args.ranks, batch=args.batch, context=args.context,
                     quant=setup.quant, microbatches=micro, domains=domains)
    rows = [{"attention_ranks": s.attention_ranks, "domains": s.domains, "expert_ranks": s.expert_ranks,
             "microbatches": s.microbatches, "step_ms": s.time * 1e3 if s.step else None,
             "attention_busy_%": 100 * s.step.attention_utilisation if s.step else None,
             "expert_busy_%": 100 * s.step.expert_utilisation if s.step else None,
             "attention_die_GiB": s.step.attention_memory.total / 2**30 if s.step else None,
             "expert_die_GiB": s.step.expert_memory.total / 2**30 if s.step else None, "refused": s.reason}
            for s in splits]
    best = splits[0] if splits and splits[0].step else None
    if best is None:
        raise NpusimError(f"no split of {args.ranks} ranks fits: {splits[0].reason if splits else 'no EP degree '}"
                          "divides the experts", field="--ranks")
    path = _write(args, setup, best)
    frame = pd.DataFrame(rows)
    title = (f"{setup.model.name} on {setup.system.name}: {args.ranks} decode ranks, batch {args.batch}, context "
             f"{args.context}; fastest: {best.attention_ranks} attention ({best.domains} domains) + "
             f"{best.expert_ranks} expert ranks, {best.microbatches} microbatches, step {best.time * 1e3:.2f} ms; "
             f"written to {path}")
    if args.format == "table":
        frame = frame.head(args.top).round(2)
    common.emit(frame, args.format, title=title)


def _write(args, setup, best) -> Path:
    doc = {"inherits": setup.plan.name,
           "description": f"npusim plan-af: {setup.model.name} decode on {args.ranks} ranks of {setup.system.name}, "
                          f"batch {args.batch}, context {args.context}: AF {best.attention_ranks} + "
                          f"{best.expert_ranks} ranks",
           "decode": {"ranks": best.attention_ranks, "ffn_ranks": best.expert_ranks,
                      "attention_domains": best.domains, "microbatches": best.microbatches,
                      "attention": {"dp": best.attention_ranks, "tp": 1, "cp": 1}, "moe": {"ep": best.expert_ranks,
                                                                                          "tp": 1}, "pp": 1}}
    path = Path(args.out)
    quant = "model" if args.quant == "model" else setup.quant.name
    header = ("# Written by npusim plan-af. Reproduce its prediction with:\n"
              f"#   npusim predict --hw {args.hw} --model {args.model} --plan {path} --batch {args.batch} "
              f"--context {args.context} --input {args.context} --output 1 --quant {quant}\n")
    path.write_text(header + yaml.safe_dump(doc, sort_keys=False))
    return path
