"""Activity-based energy: idle power over the step's time plus energy per cube and vector FLOP, per byte moved at
each level (HBM, L2, on-core) and per byte over the links, from the chip's `energy:` shares (hardware files).

Per-unit energies are the unit's share of the dynamic power (TDP - idle) divided by the unit's full rate, so a die
running every unit at its full rate draws exactly its TDP (`full_load_power`). The step's activity is what the
simulated kernels did (pipe totals of their traces, HBM/L2 bytes of the engine) on the busiest rank; every rank of
the instance is counted as that rank (an upper bound where ranks are uneven).
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.errors import NpusimError
from npusim.parallel.optime import Activity
from npusim.parallel.step import StepTime
from npusim.spec.chip import Chip


@dataclass(frozen=True)
class Rates:
    """Joules per unit of activity on one die, and its idle watts."""

    idle: float
    cube_flop: float
    vector_flop: float
    hbm_byte: float
    l2_byte: float
    core_byte: float
    link_byte: float


def full_rates(chip: Chip) -> dict[str, float]:
    """Each unit's full rate per die (FLOP/s or B/s): what its share of the dynamic power is spread over."""
    aic, aiv = chip.aic.pipes, chip.aiv.pipes
    core = (aic["mte1"].bytes_per_cycle + aic["fixpipe"].bytes_per_cycle) * chip.aic.count * chip.clock \
        + aiv["vector"].bytes_per_cycle * chip.aiv.count * chip.clock
    return {"cube": chip.peak_cube_flops("bf16"), "vector": chip.peak_vector_flops("fp32"),
            "hbm": chip.hbm.bandwidth, "l2": chip.l2.read_bandwidth, "core": core}


def rates(chip: Chip) -> Rates:
    e = chip.energy
    if e is None:
        raise NpusimError(f"{chip.name} has no energy: section (per-unit shares of its dynamic power)",
                          field="energy")
    dynamic = chip.power.tdp - chip.power.idle
    full = full_rates(chip)
    per = {unit: getattr(e, unit) * dynamic / rate for unit, rate in full.items()}
    return Rates(chip.power.idle, per["cube"], per["vector"], per["hbm"], per["l2"], per["core"], e.link)


def full_load_power(chip: Chip) -> float:
    """Watts of one die with every unit at its full rate: the TDP by construction of the shares."""
    r, full = rates(chip), full_rates(chip)
    return r.idle + r.cube_flop * full["cube"] + r.vector_flop * full["vector"] + r.hbm_byte * full["hbm"] + \
        r.l2_byte * full["l2"] + r.core_byte * full["core"]


def dynamic_energy(a: Activity, r: Rates) -> float:
    return (a.cube_flops * r.cube_flop + a.vector_flops * r.vector_flop + a.hbm_bytes * r.hbm_byte +
            a.l2_bytes * r.l2_byte + a.core_bytes * r.core_byte)


@dataclass(frozen=True)
class StepEnergy:
    """One step on one rank."""

    joules: float
    flops: float  # cube + vector FLOPs executed
    seconds: float

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds else 0.0

    @property
    def tflops_per_watt(self) -> float:
        return self.flops / self.joules / 1e12 if self.joules else 0.0


def step_energy(step: StepTime, chip: Chip) -> StepEnergy:
    r = rates(chip)
    a = step.activity
    joules = r.idle * step.time + dynamic_energy(a, r) + (step.link_bytes + step.host_bytes) * r.link_byte
    return StepEnergy(joules, a.cube_flops + a.vector_flops, step.time)
