"""A prediction of one deployment: TTFT, TPOT, throughput, memory per rank and where the time goes."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from npusim.parallel.af import AfStep
from npusim.parallel.memory import Memory
from npusim.parallel.step import StepTime
from npusim.results.energy import StepEnergy

if TYPE_CHECKING:  # pandas loads when a table is asked for, not with every prediction (issue 30)
    import pandas as pd


@dataclass(frozen=True)
class Prediction:
    """The prediction of one deployment (`npusim.predict`). Times are seconds, memory bytes, energy joules; the
    tables (`breakdown`, `phase_table`, `summary`) carry the unit in each column name.

    Fields:
        system, model, plan, quant: the names of what was predicted (the plan's file name for a plan file).
        scenario: input / output tokens, global decode batch, prefill batch and the decode context, as predicted.
        prefill, decode: one step of each phase as a timeline of layer types (`StepTime`: time, layers, streams);
            prefill is None for a decode-only plan, which runs no prefill (see notes).
        kv_transfer: seconds to move one request's caches from the prefill to the decode instance (0 co-located).
        ttft: time to first token, seconds: the prefill step of `prefill_batch` prompts plus the KV transfer (None
            without a prefill).
        tpot: seconds per output token: the decode step over the tokens it yields (1 + MTP acceptance), as published.
        decode_step: seconds of one decode step of the whole batch.
        prefill_chips, decode_chips: packages (chips, not dies) of each role, every instance counted.
        memory: per phase that runs, the bytes per rank (`Memory`: weights, kv_cache, activations, comm_buffers,
            capacity).
        tokens_per_s_per_chip: decode output tokens per second per decode chip.
        prefill_tokens_per_s_per_chip: prompt tokens per second per prefill chip (None without a prefill).
        overrides: the `--set` overrides applied.
        energy: per phase, one rank's step energy from the chip's activity model ({} when the chip has none).
        joules_per_token: per phase, the chip energy per prompt token (prefill) or output token (decode).
        notes: what the prediction does not report, and why.
        af: under attention-FFN disaggregation, the decode step's two sides (`AfStep`; None otherwise).
    """

    system: str
    model: str
    plan: str
    quant: str
    scenario: dict[str, int]
    prefill: StepTime | None  # None: a decode-only plan runs no prefill (see notes)
    decode: StepTime
    kv_transfer: float  # prefill -> decode instance, per request (0 when co-located)
    ttft: float | None  # None without a prefill
    tpot: float  # effective seconds per output token (MTP acceptance included, as published)
    decode_step: float
    prefill_chips: float
    decode_chips: float
    memory: dict[str, Memory]  # per phase that runs
    tokens_per_s_per_chip: float  # decode output tokens/s per chip
    prefill_tokens_per_s_per_chip: float | None
    overrides: dict[str, str] = field(default_factory=dict)
    energy: dict[str, "StepEnergy"] = field(default_factory=dict)  # per phase, one rank's step (chip without energy: {})
    joules_per_token: dict[str, float] = field(default_factory=dict)  # per phase: prompt tokens / output tokens
    notes: tuple[str, ...] = ()  # what the prediction does not report, and why
    af: "AfStep | None" = None  # the decode step's two sides under attention-FFN disaggregation

    def __repr__(self) -> str:
        s = self.scenario
        ttft = f"TTFT {self.ttft * 1e3:.1f} ms, " if self.ttft is not None else "no prefill, "
        return (f"Prediction({self.model} on {self.system}, plan {self.plan}, {self.quant}, input {s['input']}, "
                f"batch {s['batch']}: {ttft}TPOT {self.tpot * 1e3:.2f} ms, "
                f"{self.tokens_per_s_per_chip:.1f} decode tokens/s per chip, "
                f"{self.prefill_chips + self.decode_chips:g} chips)")

    def _repr_html_(self) -> str:
        """A notebook's view: the headline, then the per-phase table."""
        s = self.scenario
        ttft = f"TTFT <b>{self.ttft * 1e3:.1f} ms</b>, " if self.ttft is not None else "no prefill, "
        head = (f"<b>{self.model}</b> on <b>{self.system}</b>, plan {self.plan}, {self.quant}: input {s['input']}, "
                f"output {s['output']}, decode batch {s['batch']} at context {s['context']}<br>"
                f"{ttft}TPOT <b>{self.tpot * 1e3:.2f} ms</b>, {self.tokens_per_s_per_chip:.1f} decode tokens/s per "
                f"chip, {self.prefill_chips:g} + {self.decode_chips:g} chips")
        return head + self.phase_table().round(2).to_html(index=False)

    @property
    def phases(self) -> tuple[str, ...]:
        """The phases predicted: decode, and prefill unless the plan has none."""
        return ("prefill", "decode") if self.prefill is not None else ("decode",)

    def tflops_per_watt(self, phase: str) -> float:
        return self.energy[phase].tflops_per_watt if phase in self.energy else float("nan")

    def summary(self) -> dict[str, float | str]:
        """The headline figures, each key naming its unit (_s, _bytes, _per_s_per_chip, _joules_per_token)."""
        return {
            "ttft_s": self.ttft, "tpot_s": self.tpot, "decode_step_s": self.decode_step,
            "kv_transfer_s": self.kv_transfer,
            "decode_tokens_per_s_per_chip": self.tokens_per_s_per_chip,
            "prefill_tokens_per_s_per_chip": self.prefill_tokens_per_s_per_chip,
            "prefill_chips": self.prefill_chips, "decode_chips": self.decode_chips,
            **{f"{phase}_memory_per_rank_bytes": m.total for phase, m in self.memory.items()},
            **{f"{phase}_joules_per_token": j for phase, j in self.joules_per_token.items()},
            **{f"{phase}_tflops_per_watt": self.tflops_per_watt(phase) for phase in self.energy},
            **{f"{phase}_watts_per_rank": e.watts for phase, e in self.energy.items()},
        }

    def breakdown(self, phase: str = "decode") -> pd.DataFrame:
        """Per op and per collective of `phase` (default decode, the step TPOT comes from): time per call, total over
        the repeated layers, share of the step in % (share_pct), its bound and roofline."""
        import pandas as pd

        step = self.prefill if phase == "prefill" else self.decode
        rows = []
        for lt in step.layers if step is not None else ():
            for t in lt.ops:
                rows.append({"layer": lt.name, "x": lt.repeat, "op": t.op, "kind": t.kind, "per_call_us": t.time * 1e6,
                             "total_ms": t.time * lt.repeat * 1e3, "bound": t.bound,
                             "roofline_us": t.roofline * 1e6, "model": t.model})
            for name, r in lt.comms:
                rows.append({"layer": lt.name, "x": lt.repeat, "op": name, "kind": f"comm:{r.algorithm}@{r.tier}",
                             "per_call_us": r.time * 1e6, "total_ms": r.time * lt.repeat * 1e3, "bound": "link",
                             "roofline_us": float("nan"), "model": "collective"})
        frame = pd.DataFrame(rows)
        if not frame.empty:
            frame["share_pct"] = 100 * frame["total_ms"] / frame["total_ms"].sum()
        return frame

    def phase_table(self) -> pd.DataFrame:
        import pandas as pd

        rows = []
        for phase in self.phases:
            step, m = getattr(self, phase), self.memory[phase]
            rows.append({"phase": phase, "step_ms": step.time * 1e3, "compute_ms": step.compute * 1e3,
                         "comm_ms": step.comm * 1e3, "exposed_comm_ms": step.exposed_comm * 1e3,
                         "weights_GiB": m.weights / 2**30, "kv_GiB": m.kv_cache / 2**30,
                         "activations_GiB": m.activations / 2**30, "comm_buffers_GiB": m.comm_buffers / 2**30,
                         "total_GiB": m.total / 2**30, "usable_GiB": m.capacity / 2**30})
        return pd.DataFrame(rows)

    def to_json(self) -> str:
        return json.dumps({
            "system": self.system, "model": self.model, "plan": self.plan, "quant": self.quant,
            "scenario": self.scenario, "overrides": self.overrides, "summary": self.summary(),
            "phases": json.loads(self.phase_table().to_json(orient="records")),
            "breakdown": {p: json.loads(self.breakdown(p).to_json(orient="records")) for p in self.phases},
            "notes": list(self.notes),
        }, indent=2)

    def chrome_trace(self) -> dict:
        """One layer of each type, prefill then decode, every stream a track (Perfetto / chrome://tracing)."""
        events, offset, pid = [], 0.0, 0
        for phase in self.phases:
            for lt in getattr(self, phase).layers:
                events += lt.timeline.chrome_events(pid=pid, process=f"{phase}: {lt.name} (x{lt.repeat})",
                                                    offset=offset)
                offset += lt.time
                pid += 1
        return {"traceEvents": events, "displayTimeUnit": "ms"}
