"""A scenario: one deployment to predict — system, model, plan, quantisation, lengths, batch and `--set` overrides —
as a YAML file, so a baseline and its variants can be compared (`npusim compare`). A variant usually `inherits:` the
scenario before it and adds the overrides of one more switch, so a chain of files reads as switches applied in turn.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.spec.catalog import Catalog, Provenance
from npusim.errors import NpusimError, as_written, option
from npusim.spec.schema import count, internal, setting, table, text


@dataclass(frozen=True, kw_only=True)
class Scenario:
    name: str = text()
    description: str = text(default="")
    label: str = text(default="", doc="short name in tables and figures (default: the scenario's name)")
    hw: str = text(default="cloudmatrix384")
    model: str = text(default="deepseek-v3.2-exp")
    plan: str = text(default="v32-a3-pd-a17")
    quant: str = text(default="bf16", doc="quantisation preset; 'model' = the checkpoint's own format")
    input: int = count(default=131072, doc="prompt tokens")
    output: int = count(default=1024, doc="output tokens")
    batch: int = count(default=256, doc="global decode batch")
    prefill_batch: int = count(default=1, doc="prompts prefilled together for TTFT")
    context: int = count(default=0, minimum=0, doc="decode context (0 = input + output / 2)")
    set: dict[str, str] = table(text(), default={}, doc="overrides by dotted path, as `--set` (plan.*, model.*, hw)")
    provenance: Provenance = internal()

    @property
    def title(self) -> str:
        return self.label or self.name

    def predict_args(self) -> dict:
        """Keyword arguments of api.predict."""
        return {"hw": self.hw, "model": self.model, "plan": self.plan, "input": self.input, "output": self.output,
                "batch": self.batch, "prefill_batch": self.prefill_batch, "context": self.context or None,
                "quant": None if self.quant == "model" else self.quant,
                "overrides": {k: setting(v, **self.provenance.where(f"set.{k}")) for k, v in self.set.items()}}

    def named(self, exc: NpusimError) -> NpusimError:
        """A refusal of predict_args's arguments named as this file wrote them (`input`, not `--input`)."""
        keys = ("hw", "model", "plan", "quant", "input", "output", "batch", "prefill_batch", "context")
        return as_written(exc, {option(k): self.provenance.where(k) for k in keys})


SCENARIOS = Catalog("scenario", "workloads/scenarios", Scenario, require_sources=False)


def load_scenario(name: str, overrides: dict[str, str] | None = None) -> Scenario:
    return SCENARIOS.load(name, overrides)
