"""The chip: a DaVinci die (AIC cube cores, AIV vector cores, their pipes and buffers, L2, HBM) and its package.

All per-core and memory figures describe ONE die (the rank the runtime sees); `dies` multiplies them for a package.
Peaks are derived (cores x FLOP/cycle x clock), never typed in.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from npusim.errors import NpusimError
from npusim.spec.catalog import Catalog, Provenance
from npusim.spec.schema import count, internal, quantity, ratio, shape, table, text

CUBE_DTYPES = ("fp16", "bf16", "fp32", "hf32", "int8", "int4", "fp8", "hif8", "mxfp8", "mxfp4")
VECTOR_DTYPES = ("fp16", "bf16", "fp32", "int8", "int16", "int32")
REQUIRED_CUBE = ("fp16", "bf16")  # the headline peaks, the energy model's full-rate cube
REQUIRED_VECTOR = ("fp16", "fp32")  # the headline peaks, the energy model's full-rate vector
AIC_PIPES = ("mte2", "mte1", "cube", "fixpipe", "scalar")
AIV_PIPES = ("mte2", "vector", "mte3", "scalar")
BYTES_PER_ELEMENT = {"fp32": 4.0, "hf32": 4.0, "fp16": 2.0, "bf16": 2.0, "int8": 1.0, "fp8": 1.0, "hif8": 1.0,
                     "mxfp8": 1.0, "int4": 0.5, "mxfp4": 0.5, "int16": 2.0, "int32": 4.0}


@dataclass(frozen=True, kw_only=True)
class Pipe:
    """An in-order instruction queue of a core; instructions of different pipes run concurrently."""

    bytes_per_cycle: float = quantity("number", doc="sustained data rate of the pipe per core")
    latency_cycles: float = quantity("number", minimum=0.0, strict=False, doc="fixed start-up cost per instruction")
    issue_cycles: float | None = quantity("number", default=None, minimum=0.0, strict=False,
                                          doc="cycles to issue each further DMA instruction of a discrete gather, "
                                              "or on the vector pipe each further instruction of a PipeBarrier'd "
                                              "chain (none: not modelled on this pipe)")
    routes: dict[str, float] = table(quantity("number"), default={},
                                     doc="per source>destination rate where it differs; hbm>DST: the part of a GM "
                                         "read that misses L2 (one core's DMA stream waiting on HBM latency)")


@dataclass(frozen=True, kw_only=True)
class Cube:
    flop_per_cycle: dict[str, float] = table(quantity("number"), keys=CUBE_DTYPES, doc="per AIC, 1 MAC = 2 FLOP")
    fractal: dict[str, tuple[int, int, int]] = table(shape(), keys=CUBE_DTYPES, doc="M x K x N of one mmad step")


@dataclass(frozen=True, kw_only=True)
class Vector:
    flop_per_cycle: dict[str, float] = table(quantity("number"), keys=VECTOR_DTYPES, doc="per AIV, FMA = 2 FLOP")
    repeat_bytes: float = quantity("bytes", doc="bytes processed by one vector repeat")


@dataclass(frozen=True, kw_only=True)
class AicBuffers:
    l1: float = quantity("bytes")
    l0a: float = quantity("bytes")
    l0b: float = quantity("bytes")
    l0c: float = quantity("bytes")
    bias_table: float = quantity("bytes")
    fixpipe: float = quantity("bytes", doc="fixpipe parameter buffers fb0..fb3 together")


@dataclass(frozen=True, kw_only=True)
class AivBuffers:
    ub: float = quantity("bytes")


@dataclass(frozen=True, kw_only=True)
class Aic:
    count: int = count()
    cube: Cube
    pipes: dict[str, Pipe]
    buffers: AicBuffers


@dataclass(frozen=True, kw_only=True)
class Aiv:
    count: int = count()
    vector: Vector
    pipes: dict[str, Pipe]
    buffers: AivBuffers


@dataclass(frozen=True, kw_only=True)
class Cache:
    size: float = quantity("bytes")
    read_bandwidth: float = quantity("bandwidth")
    write_bandwidth: float = quantity("bandwidth")


@dataclass(frozen=True, kw_only=True)
class Hbm:
    capacity: float = quantity("bytes")
    usable: float = quantity("bytes", doc="capacity left to the application after the runtime's reservation")
    bandwidth: float = quantity("bandwidth")
    kind: str = text(default="HBM")


@dataclass(frozen=True, kw_only=True)
class Overheads:
    kernel_launch: float = quantity("time", minimum=0.0, strict=False, doc="eager launch of one kernel")
    graph_launch: float = quantity("time", minimum=0.0, strict=False, doc="per kernel inside a captured graph")
    cross_core_sync: float = quantity("time", minimum=0.0, strict=False, doc="one AIC<->AIV flag hand-off through GM")
    task_dispatch: float = quantity("time", minimum=0.0, strict=False,
                                    doc="device-side dispatch of a kernel task onto its cores and its completion: "
                                        "what msprof Task Duration counts beyond the busiest core's active time")
    core_start: float = quantity("time", minimum=0.0, strict=False,
                                 doc="a core's prologue before its first tile (kernel entry, arguments and tiling "
                                     "data read from GM by the scalar unit); the cores start in parallel")
    mix_start: float = quantity("time", minimum=0.0, strict=False,
                                doc="the further start-up of a MIX task, which starts an AIC and its two AIVs per "
                                    "block (KERNEL_TYPE_MIX_AIC_1_2) where an AIC-only or AIV-only task starts one "
                                    "kind of core")
    all_to_all_peer: float = quantity("time", minimum=0.0, strict=False,
                                      doc="per peer of a bulk (prefill) all-to-all: its own transfer and notify "
                                          "task for every other rank of the group")


@dataclass(frozen=True, kw_only=True)
class Comm:
    """What a communication kernel takes from the die's compute kernels while it runs beside them
    (npusim.engine.streams): AIV cores it holds and local HBM traffic."""

    hbm_per_byte: float = quantity("number", minimum=0.0, strict=False,
                                   doc="local HBM bytes moved per byte a collective delivers to this rank (send "
                                       "buffer read, the peer's write into the window, the window's read-out and "
                                       "the output's write)")
    aiv_per_rank: int = count(doc="AIV cores an HCCL AIV-mode collective holds per rank of its group")
    fused_dispatch_aiv: float = ratio(doc="share of the die's AIV cores the fused MoE dispatch / combine (MC2) "
                                          "holds")


@dataclass(frozen=True, kw_only=True)
class Power:
    tdp: float = quantity("power")
    idle: float = quantity("power")


@dataclass(frozen=True, kw_only=True)
class Energy:
    """Activity-based power: the share of the dynamic power (power.tdp - power.idle) each unit draws when it runs at
    its full rate (cube at peak BF16, vector at peak FP32, HBM and L2 at their bandwidths, the on-core moves of MTE1,
    FIXPIPE and the vector unit at their pipe rates). The shares sum to 1, so a chip at full load on every unit draws
    its TDP; energy per FLOP or per byte follows (results/energy.py). Links are priced per byte apart."""

    cube: float = ratio()
    vector: float = ratio()
    hbm: float = ratio()
    l2: float = ratio()
    core: float = ratio(doc="on-core data movement (L1->L0, L0C out, UB streaming)")
    link: float = quantity("energy", doc="per byte sent over a chip-to-chip or host link (SerDes, PHY, switch)")


@dataclass(frozen=True, kw_only=True)
class Efficiency:
    """Achievable fractions of peak: named, calibrated parameters (fitted to published.md in later issues)."""

    cube: float = ratio()
    vector: float = ratio()
    hbm: float = ratio()
    l2: float = ratio()
    link: float = ratio()
    bulk_all_to_all: float = ratio(doc="of the link rate a bulk (prefill) all-to-all kernel moves its rows at "
                                       "(HCCL all_to_all_v, DeepEP normal mode), beside its per-peer cost")


@dataclass(frozen=True, kw_only=True)
class Chip:
    name: str = text()
    description: str = text(default="")
    family: str = text(choices=("910b", "910c", "950"))
    arch: str = text(doc="CANN arch name, e.g. dav-c220")
    dies: int = count()
    clock: float = quantity("frequency")
    aic: Aic
    aiv: Aiv
    l2: Cache
    hbm: Hbm
    die_to_die: float | None = quantity("bandwidth", default=None, doc="per direction between the dies of a package")
    overheads: Overheads
    power: Power
    energy: Energy | None = None
    comm: Comm | None = None  # none: communication kernels take nothing from the compute kernels beside them
    efficiency: Efficiency
    price: float = quantity("money", doc="per package")
    provenance: Provenance = internal()

    @functools.cached_property
    def content(self) -> str:
        """repr(self) (every field but the provenance), computed once per chip object: the kernel, engine and layer
        memos key their results by it, and a chip's repr walks over a hundred nested fields (a sweep point asked for
        it dozens of times)."""
        return repr(self)

    # ---------------------------------------------------------------- derived figures (per die unless said)
    def cube_rate(self, dtype: str) -> float:
        """FLOP per cycle of one AIC in `dtype`, refused in a sentence when the chip file gives none."""
        return self._rate(self.aic.cube.flop_per_cycle, "aic.cube.flop_per_cycle", dtype)

    def vector_rate(self, dtype: str) -> float:
        """FLOP per cycle of one AIV in `dtype`, refused in a sentence when the chip file gives none."""
        return self._rate(self.aiv.vector.flop_per_cycle, "aiv.vector.flop_per_cycle", dtype)

    def _rate(self, rates: dict[str, float], where: str, dtype: str) -> float:
        if dtype not in rates:
            raise NpusimError(f"{self.name} gives no {dtype} rate, which this run needs (it has "
                              f"{', '.join(rates) or 'none'})",
                              **(self.provenance.where(f"{where}.{dtype}") if self.provenance else {}))
        return rates[dtype]

    def peak_cube_flops(self, dtype: str) -> float:
        return self.aic.count * self.cube_rate(dtype) * self.clock

    def peak_vector_flops(self, dtype: str = "fp16") -> float:
        return self.aiv.count * self.vector_rate(dtype) * self.clock

    def marketing_flops(self, dtype: str = "fp16") -> float:
        """Huawei's 'total' figure for A2/A5: cube + vector of the same dtype."""
        return self.peak_cube_flops(dtype) + self.peak_vector_flops(dtype)

    @property
    def package_hbm_capacity(self) -> float:
        return self.hbm.capacity * self.dies

    @property
    def package_hbm_bandwidth(self) -> float:
        return self.hbm.bandwidth * self.dies

    def package_peak_cube_flops(self, dtype: str) -> float:
        return self.peak_cube_flops(dtype) * self.dies

    def derived(self) -> list[tuple[str, float, str, str]]:
        """Headline figures computed from the fields: (name, value, dimension, formula)."""
        rows = []
        for dtype in self.aic.cube.flop_per_cycle:
            rows.append((f"peak.cube.{dtype}", self.peak_cube_flops(dtype) / 1e12, "number",
                         "TFLOPS per die = aic.count x cube.flop_per_cycle x clock"))
        for dtype in self.aiv.vector.flop_per_cycle:
            rows.append((f"peak.vector.{dtype}", self.peak_vector_flops(dtype) / 1e12, "number",
                         "TFLOPS per die = aiv.count x vector.flop_per_cycle x clock"))
        rows.append(("peak.cube_plus_vector.fp16", self.marketing_flops() / 1e12, "number",
                     "TFLOPS per die, Huawei's 'total' = cube + vector fp16"))
        if self.dies > 1:
            rows.append(("package.cube.bf16", self.package_peak_cube_flops("bf16") / 1e12, "number",
                         "TFLOPS per package = dies x per-die peak"))
            rows.append(("package.hbm.capacity", self.package_hbm_capacity, "bytes", "dies x hbm.capacity"))
            rows.append(("package.hbm.bandwidth", self.package_hbm_bandwidth, "bandwidth", "dies x hbm.bandwidth"))
        return rows

    def check(self) -> list[tuple[str, str]]:
        """Consistency rules that no single field can express: (field, sentence) for each violation."""
        problems = []
        b = self.aic.buffers
        for name in ("l0a", "l0b", "l0c"):
            size = getattr(b, name)
            if size > b.l1:
                problems.append((f"aic.buffers.{name}", f"is {size / 1024:g} KiB, larger than L1 ({b.l1 / 1024:g} KiB)"))
        for dtype, (m, k, n) in self.aic.cube.fractal.items():
            size = BYTES_PER_ELEMENT[dtype]
            acc = 4.0
            for buf, need in (("l0a", m * k * size), ("l0b", k * n * size), ("l0c", m * n * acc)):
                if need > getattr(b, buf):
                    problems.append((f"aic.cube.fractal.{dtype}",
                                     f"{m}x{k}x{n} needs {need:g} B of {buf.upper()} but aic.buffers.{buf} is {getattr(b, buf):g} B"))
        for rates, where, needed in ((self.aic.cube.flop_per_cycle, "aic.cube.flop_per_cycle", REQUIRED_CUBE),
                                     (self.aiv.vector.flop_per_cycle, "aiv.vector.flop_per_cycle", REQUIRED_VECTOR)):
            for dtype in needed:
                if dtype not in rates:
                    problems.append((f"{where}.{dtype}", "is missing: every chip needs the rates of "
                                                         f"{', '.join(needed)} (headline peaks and energy read them)"))
        for dtype in self.aic.cube.flop_per_cycle:
            if dtype not in self.aic.cube.fractal:
                problems.append((f"aic.cube.fractal.{dtype}", "is missing: every cube dtype with a rate needs a fractal"))
        for pipes, allowed, where in ((self.aic.pipes, AIC_PIPES, "aic.pipes"), (self.aiv.pipes, AIV_PIPES, "aiv.pipes")):
            for p in allowed:
                if p not in pipes:
                    problems.append((f"{where}.{p}", f"is missing (pipes of this core: {', '.join(allowed)})"))
            for p in pipes:
                if p not in allowed:
                    problems.append((f"{where}.{p}", f"is not a pipe of this core (allowed: {', '.join(allowed)})"))
        if self.hbm.usable > self.hbm.capacity:
            problems.append(("hbm.usable", "is larger than hbm.capacity"))
        if self.energy is not None:
            e = self.energy
            shares = e.cube + e.vector + e.hbm + e.l2 + e.core
            if abs(shares - 1.0) > 1e-6:
                problems.append(("energy", f"the unit shares of the dynamic power must sum to 1, got {shares:g}"))
        if self.dies > 1 and self.die_to_die is None:
            problems.append(("die_to_die", "is missing: a package of several dies needs the die-to-die bandwidth"))
        return problems


CHIPS = Catalog("chip", "hardware/chips", Chip)


def load_chip(name: str, overrides: dict[str, str] | None = None) -> Chip:
    return CHIPS.load(name, overrides)


# What "more resource" means for the monotonicity checks (issue 15): each doubles the fields named, as `--set`
# overrides would. More of any of them may never make a kernel or a prediction slower.
RESOURCES: dict[str, tuple[str, ...]] = {
    "l0a": ("aic.buffers.l0a",), "l0b": ("aic.buffers.l0b",), "l0c": ("aic.buffers.l0c",), "l1": ("aic.buffers.l1",),
    "ub": ("aiv.buffers.ub",), "cube": ("aic.cube.flop_per_cycle",), "vector": ("aiv.vector.flop_per_cycle",),
    "hbm": ("hbm.bandwidth",), "l2": ("l2.read_bandwidth", "l2.write_bandwidth"),
}


def resource_overrides(chip: Chip, resource: str, factor: float = 2.0) -> dict[str, str]:
    """`--set` overrides giving `chip` `factor` times `resource` (one of RESOURCES; a rate table: every dtype)."""
    out = {}
    for path in RESOURCES[resource]:
        node = chip
        for part in path.split("."):
            node = getattr(node, part)
        unit = " B/s" if "bandwidth" in path else " B" if "buffers" in path else ""
        items = node.items() if isinstance(node, dict) else [(None, node)]
        for key, v in items:
            out[f"{path}.{key}" if key else path] = f"{v * factor!r}{unit}"
    return out


def with_more(chip: Chip, resource: str, factor: float = 2.0) -> Chip:
    """`chip` with `factor` times `resource` (what `resource_overrides` sets, without reloading the YAML)."""
    r = dataclasses.replace
    if resource in ("l0a", "l0b", "l0c", "l1"):
        return r(chip, aic=r(chip.aic, buffers=r(chip.aic.buffers, **{resource: getattr(chip.aic.buffers, resource)
                                                                      * factor})))
    if resource == "ub":
        return r(chip, aiv=r(chip.aiv, buffers=r(chip.aiv.buffers, ub=chip.aiv.buffers.ub * factor)))
    if resource == "cube":
        rates = {k: v * factor for k, v in chip.aic.cube.flop_per_cycle.items()}
        return r(chip, aic=r(chip.aic, cube=r(chip.aic.cube, flop_per_cycle=rates)))
    if resource == "vector":
        rates = {k: v * factor for k, v in chip.aiv.vector.flop_per_cycle.items()}
        return r(chip, aiv=r(chip.aiv, vector=r(chip.aiv.vector, flop_per_cycle=rates)))
    if resource == "hbm":
        return r(chip, hbm=r(chip.hbm, bandwidth=chip.hbm.bandwidth * factor))
    if resource == "l2":
        return r(chip, l2=r(chip.l2, read_bandwidth=chip.l2.read_bandwidth * factor,
                            write_bandwidth=chip.l2.write_bandwidth * factor))
    raise KeyError(resource)
