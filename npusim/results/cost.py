"""Cost of a prediction: dollars per million tokens and joules per token, from the system's power and price.

The hardware files give an all-in power and price per chip (system.power_per_chip, system.price_per_chip, each sourced
or marked estimate); how long the chips are paid off over, how busy they are kept and what electricity costs are
deployment choices, so they are named parameters here with stated defaults rather than hardware fields.
"""

from __future__ import annotations

import math

from dataclasses import asdict, dataclass

from npusim.api import split_overrides
from npusim.errors import NpusimError
from npusim.results.prediction import Prediction
from npusim.spec.system import load_system

SECONDS_PER_YEAR = 365.25 * 86400


@dataclass(frozen=True)
class CostParams:
    """Deployment economics. Defaults: 4-year straight-line amortisation (a common server depreciation period),
    60 % of the hours serving at the predicted rate, US$0.10 per kWh and a PUE of 1.3 (air-cooled data centre)."""

    amortisation_years: float = 4.0
    utilisation: float = 0.6
    usd_per_kwh: float = 0.10
    pue: float = 1.3

    def describe(self) -> str:
        return (f"{self.amortisation_years:g}-year amortisation, {self.utilisation:.0%} utilisation, "
                f"${self.usd_per_kwh:g}/kWh, PUE {self.pue:g}")

    def __post_init__(self):
        for name in ("amortisation_years", "utilisation", "usd_per_kwh", "pue"):
            if getattr(self, name) <= 0:
                raise NpusimError(f"must be positive, got {getattr(self, name)}", field=name)
        if self.utilisation > 1:
            raise NpusimError(f"is a fraction of the time (0-1], got {self.utilisation}", field="utilisation")


@dataclass(frozen=True)
class Cost:
    """Per phase: decode cost is per output token, prefill cost per prompt token. The joules are the system's
    all-in power (hosts, switches, optics) times the PUE at the predicted rate: the facility's energy, beside the
    chip's activity-based energy that Prediction.joules_per_token reports."""

    usd_per_chip_hour: float
    decode_usd_per_mtok: float
    prefill_usd_per_mtok: float
    decode_system_joules_per_token: float
    prefill_system_joules_per_token: float

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def chip_usd_per_second(power_w: float, price_usd: float, params: CostParams) -> float:
    """What one chip costs per second it exists: its price spread over the amortisation, plus its electricity."""
    capital = price_usd / (params.amortisation_years * SECONDS_PER_YEAR)
    energy = power_w * params.pue * params.usd_per_kwh / 3.6e6
    return capital + energy


def cost(pred: Prediction, params: CostParams = CostParams(), hw: str | None = None) -> Cost:
    """Cost of the prediction's deployment on its system (with the same hardware overrides). `hw`: the system as
    the prediction was asked for, a catalog name or a YAML file (the prediction keeps only its name, which a file
    outside hardware/systems does not resolve)."""
    system = load_system(hw or pred.system, split_overrides(pred.overrides)["hw"])
    per_s = chip_usd_per_second(system.power_per_chip, system.price_per_chip, params) / params.utilisation
    watts = system.power_per_chip * params.pue
    prefill_rate = pred.prefill_tokens_per_s_per_chip or math.nan  # a decode-only plan: no prefill cost
    return Cost(usd_per_chip_hour=per_s * 3600,
                decode_usd_per_mtok=per_s / pred.tokens_per_s_per_chip * 1e6,
                prefill_usd_per_mtok=per_s / prefill_rate * 1e6,
                decode_system_joules_per_token=watts / pred.tokens_per_s_per_chip,
                prefill_system_joules_per_token=watts / prefill_rate)
