"""What every kernel shares: the registry, shape handling, the roofline, and spreading blocks over AI cores.

A kernel is a small dataclass built from plain shape integers (so an op graph's `{kernel, shape}` maps onto it)
plus options (dtype scheme, tile overrides). `trace(chip)` returns its tile trace, refused if it does not fit the
chip's buffers; `roofline(chip)` its analytic lower bound.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, ClassVar

from npusim.errors import NpusimError, did_you_mean
from npusim.kernels.tile import Lin, PerCore, lin, let
from npusim.kernels.trace import Group, Instr, Loop, Node, Program, Trace, check_fits
from npusim.spec.chip import BYTES_PER_ELEMENT, AicBuffers, Chip

KERNELS: dict[str, type["Kernel"]] = {}


def register(cls):
    KERNELS[cls.name] = cls
    return cls


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def nbytes(dtype: str, *dims: float) -> float:
    return BYTES_PER_ELEMENT[dtype] * math.prod(dims)


@dataclass(frozen=True)
class Work:
    """The op's compulsory work: the roofline's numerators."""

    cube_flops: float
    hbm_bytes: float
    vector_flops: float = 0.0
    cube_dtype: str = "bf16"
    vector_dtype: str = "fp32"


@dataclass(frozen=True)
class Roofline:
    time: float
    bound: str  # "cube" | "vector" | "hbm"
    cube_time: float
    vector_time: float
    hbm_time: float


def roofline(chip: Chip, work: Work) -> Roofline:
    """Lower bound of any kernel: max of cube, vector and HBM time at the chip's peaks."""
    times = {
        "cube": work.cube_flops / chip.peak_cube_flops(work.cube_dtype) if work.cube_flops else 0.0,
        "vector": work.vector_flops / chip.peak_vector_flops(work.vector_dtype) if work.vector_flops else 0.0,
        "hbm": work.hbm_bytes / chip.hbm.bandwidth,
    }
    bound = max(times, key=times.get)
    return Roofline(times[bound], bound, times["cube"], times["vector"], times["hbm"])


def capacity(chip: Chip) -> dict[str, float]:
    b = chip.aic.buffers
    return {"l1": b.l1, "l0a": b.l0a, "l0b": b.l0b, "l0c": b.l0c, "ub": chip.aiv.buffers.ub}


TILER_L0 = 64 * 1024  # bytes of L0A / L0B a cube tiler fills at most (the 910B / 910C / 950 L0A and L0B)
TILER_L1 = 512 * 1024  # bytes of L1 a cube tiler fills at most (the same chips' L1)


def tiler_buffers(chip: Chip) -> AicBuffers:
    """The AIC buffers a cube tiler fills with its double-buffered L0 blocks and L1 tiles: the chip's, up to the
    sizes of the chips the tilings were written for (catlass's on 64 KiB L0A / L0B and 512 KiB L1, e.g. BasicMatmul
    fp16 L1TileShape 128x256x256 and L0TileShape 128x256x64). Deeper tiles hide no more latency once the loads
    stream behind the cube; they only lengthen the pipeline's fill (the first L1 tile is loaded before the cube
    starts) and its drain, which the engine shows slower (a 1024 x 1536 x 7168 bf16 GEMM on a 910C die: step_k 4
    -> 8 at twice the L1, 80.8 -> 82.4 us). So more L0 / L1 than this is left unused, as a tuner that measured it
    would; a larger L0C or UB still allows larger blocks, among which the tuner chooses by the engine."""
    b = chip.aic.buffers
    return dataclasses.replace(b, l0a=min(b.l0a, TILER_L0), l0b=min(b.l0b, TILER_L0), l1=min(b.l1, TILER_L1))


def read_seconds(chip: Chip, nbytes_: float, hit: float, core: str = "aic") -> float:
    """One core's MTE2 time for a GM read of which `hit` is served by L2: the hits at the pipe's GM->L1 rate, the
    misses at its HBM rate (the route `hbm>l1` / `hbm>ub`, the engine's rule), shared servers aside."""
    pipe, dst = (chip.aic, "l1") if core == "aic" else (chip.aiv, "ub")
    mte2 = pipe.pipes["mte2"]
    route = mte2.routes.get(f"gm>{dst}", mte2.bytes_per_cycle)
    miss = min(route, mte2.routes.get(f"hbm>{dst}", route))
    return nbytes_ * (hit / route + (1 - hit) / miss) / chip.clock


TILE_FLOOR = 16384  # bytes: the least a streamed tile moves when the tuner cuts a core's share finer (estimate: four
# times the 4 KB least tile of the HcPost tiling, models.md §2.5, so a tile's DMA start-up stays a small part of it)


def ladder(top: int) -> list[int]:
    """The tile counts a tuner tries, up to `top`: 1, 2, 3, 4, 6, 8, 12, 16, ... (powers of two and 1.5 times
    them). Fixed, so it does not move with the chip."""
    out, p = [], 1
    while p <= top:
        out += [p] + ([p * 3 // 2] if p >= 2 and p * 3 // 2 <= top else [])
        p *= 2
    return out


def even_tiles(share: int, fewest: int, item_bytes: float) -> list[int]:
    """Items per tile to try when a core's `share` of items is streamed through a double-buffered queue in equal
    tiles: the share cut into n tiles for each n of the fixed `ladder` from `fewest` (the fewest tiles that fit the
    buffer) up to the most whose tiles still move TILE_FLOOR bytes — the fewest first, as the tiler would pick.

    Fewer, larger tiles are not faster: the first tile's load and the last one's store are not overlapped, and they
    grow with the tile (e.g. quantise 4096 x 576 on a 910C die: 3 tiles a core 12.2 us, 8 tiles 11.9 us). The
    ladder does not depend on the buffer, so a larger buffer's candidates hold a smaller one's choice."""
    most = max(fewest, int(share * item_bytes // TILE_FLOOR))
    counts = [fewest] + [n for n in ladder(most) if n > fewest]
    return list(dict.fromkeys(cdiv(share, n) for n in counts))


def need_cube(chip: Chip, dtype: str) -> None:
    if dtype not in chip.aic.cube.flop_per_cycle:
        raise NpusimError(f"{chip.name} has no {dtype} cube mode{did_you_mean(dtype, chip.aic.cube.flop_per_cycle)}",
                          field="dtype")


MAX_SIZE = 2**31 - 1  # the largest shape value a kernel takes (estimate: AscendC tiling data and catlass's
# GemmCoord hold a dimension in a 32-bit field; beyond it a shape is no launch any chip can make)


@dataclass(frozen=True)
class Allowed:
    """The values a shape key takes: a number from `low` (above it when `above`) up to `high`, or, for text, one of
    `choices` (none: the kernel checks its text itself)."""

    low: float = 0
    high: float = MAX_SIZE
    above: bool = False
    choices: tuple[str | int, ...] = ()

    def refusal(self, value) -> str:
        """Why `value` is not allowed ("" when it is)."""
        if isinstance(value, str):
            if not self.choices or value in self.choices:
                return ""
            return "is not one of " + ", ".join(repr(c) if c else "'' (none)" for c in self.choices)
        if self.choices and value not in self.choices:  # a flag
            return f"must be one of {', '.join(map(str, self.choices))}"
        if value < self.low or (self.above and value == self.low):
            return f"must be {'above' if self.above else 'at least'} {self.low:g}"
        if value > self.high:
            return f"must be at most {self.high:.0f}"
        return ""


def allowed(cls: type["Kernel"], f: dataclasses.Field) -> Allowed:
    """What a kernel's field takes: its class's `limits` where it declares them, else by its kind — a dimension
    (no default) or a count whose default is at least 1 from 1, one whose default is 0 (the tiler's choice) from 0;
    a real number finite and not negative (above 0 when its default is); a dtype one of the element types."""
    if f.name in cls.limits:
        return cls.limits[f.name]
    if f.type == "str":
        types = tuple(BYTES_PER_ELEMENT) + (("",) if f.default == "" else ())
        return Allowed(choices=types if f.name.endswith("dtype") else ())
    if f.type == "float":
        return Allowed(high=math.inf, above=f.default > 0)
    return Allowed(low=1 if f.default is dataclasses.MISSING or f.default >= 1 else 0)


@dataclass(frozen=True)
class Kernel:
    """Base of the tilings. Subclasses: `name`, int shape fields, `work()`, `build(chip)`."""

    name: ClassVar[str] = ""
    options: ClassVar[tuple[str, ...]] = ()  # fields that are not shape dims (dtype scheme, tile sizes)
    limits: ClassVar[dict[str, Allowed]] = {}  # shape keys whose values the rule of `allowed` does not describe

    @classmethod
    def from_shape(cls, shape: dict[str, Any], **options: Any) -> "Kernel":
        """Build from an op's shape dict (unknown keys are an error naming the allowed ones)."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        args = {}
        for key, val in {**shape, **options}.items():
            if key not in fields:
                raise NpusimError(f"kernel {cls.name} has no shape key '{key}'{did_you_mean(key, fields)}",
                                  field="shape")
            f = fields[key]
            try:
                args[key] = str(val) if f.type == "str" else float(val) if f.type == "float" else int(val)
                if f.type == "float" and not math.isfinite(args[key]):
                    raise ValueError(val)
            except (TypeError, ValueError):
                what = "text" if f.type == "str" else "finite number" if f.type == "float" else "whole number"
                raise NpusimError(f"kernel {cls.name} shape '{key}={val}' is not a {what}", field="shape") from None
        missing = [n for n, f in fields.items() if f.default is dataclasses.MISSING and n not in args]
        if missing:
            raise NpusimError(f"kernel {cls.name} needs shape keys {', '.join(missing)}", field="shape")
        for key, val in args.items():
            why = allowed(cls, fields[key]).refusal(val)
            if why:
                raise NpusimError(f"kernel {cls.name} shape '{key}={val}' {why}", field="shape")
        return cls(**args)

    @property
    def shape(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if f.name not in self.options and isinstance(getattr(self, f.name), int)}

    def work(self) -> Work:
        raise NotImplementedError

    def build(self, chip: Chip) -> Trace:
        raise NotImplementedError

    def candidates(self, chip: Chip) -> tuple["Kernel", ...]:
        """Tilings the tuner (npusim.engine.tune) times to choose from, the estimate's best first, each with its
        tiling options explicit and the ones given kept. A kernel without a choice offers itself."""
        return (self,)

    def trace(self, chip: Chip) -> Trace:
        t = self.build(chip)
        check_fits(t, capacity(chip))
        return t

    def roofline(self, chip: Chip) -> Roofline:
        return roofline(chip, self.work())


# ------------------------------------------------------------------------------------------------ building blocks
def addr(**bindings) -> Instr:
    """Scalar address arithmetic at the top of a block (binds the block's coordinates for the functional path)."""
    return Instr("scalar", "addr", action=let(**bindings))


def scaled(i: Lin, f: int, base: int = 0) -> Lin:
    """The element offset f*i + base of tile index i (i affine)."""
    return Lin(i.base * f + base, tuple((v, c * f) for v, c in i.terms))


@dataclass(frozen=True)
class Band:
    """`blocks` blocks of identical work; bodies use the env var 'blk' (block index within the band)."""

    blocks: int
    aic: tuple[Node, ...] | None
    aiv: tuple[tuple[Node, ...], ...] = ()
    bind: tuple[tuple[str, int], ...] = ()  # band constants (first block, loop counts) so bodies can be shared
    lead: tuple[tuple[Node, ...], ...] = ()  # per AIV: run once before this band's blocks on a core (a barrier)


def distribute(bands: list[Band], cores: int, flags: dict[str, int]) -> tuple[Group, ...]:
    """Spread each band's blocks over the cores in waves, the remainder rotating so load stays balanced.

    Core c runs, per band, the blocks blk = cores*w + s with s = (c - rot) mod cores. Runs of consecutive cores
    with the same block counts are folded into one Group (copies), e.g. a GEMM gives a full-wave group and a tail.
    """
    counts, rots, rot = [], [], 0
    for band in bands:
        q, r = divmod(band.blocks, cores)
        counts.append([q + ((c - rot) % cores < r) for c in range(cores)])
        rots.append(rot)
        rot = (rot + r) % cores

    def segments(key: tuple[int, ...]) -> list[tuple[Band, int, Instr]]:
        return [(band, n, addr(**dict(band.bind), s=lin(("core", 1), base=-r, mod=cores),
                               blk=lin(("w", cores), ("s", 1)))) for band, n, r in zip(bands, key, rots)]

    groups, c = [], 0
    while c < cores:
        key = tuple(cnt[c] for cnt in counts)
        start = c
        while c < cores and tuple(cnt[c] for cnt in counts) == key:
            c += 1
        if any(key):  # folded copies differ only in the core id the functional path binds
            groups.append(_group(segments(key), start, c - start, flags))
    return tuple(groups)


def place(runs: list[list[Band]], flags: dict[str, int]) -> tuple[Group, ...]:
    """Each core its own run of bands, in order: core c runs every band of runs[c], its blocks blk = 0 .. blocks-1
    one after another (a kernel that splits its work by block index into contiguous runs, e.g. LightningIndexer's
    SplitCore). Cores whose runs have the same bands (bodies and block counts) fold into one Group, renumbered so
    that its copies are consecutive (which core runs which run is a relabelling, nothing in the runs depends on
    it); a band constant that differs between them becomes a PerCore table."""
    classes: dict[tuple, list[int]] = {}
    for c, run in enumerate(runs):
        if run:
            classes.setdefault(_run_key(run), []).append(c)
    groups, first = [], 0
    for cores in classes.values():
        segments = []
        for i, band in enumerate(runs[cores[0]]):
            values = {name: tuple(dict(runs[c][i].bind)[name] for c in cores) for name, _ in band.bind}
            bind = {name: v[0] if len(set(v)) == 1 else PerCore(v, first) for name, v in values.items()}
            segments.append((band, band.blocks, addr(**bind, blk=lin(("w", 1)))))
        groups.append(_group(segments, first, len(cores), flags))
        first += len(cores)
    return tuple(groups)


def _run_key(run: list[Band]) -> tuple:
    return tuple((b.blocks, tuple(n for n, _ in b.bind), id(b.aic), tuple(map(id, b.aiv)), tuple(map(id, b.lead)))
                 for b in run)


def _program(core_kind: str, which: int, segments: list[tuple[Band, int, Instr]]) -> Program:
    """The AIC (which < 0) or AIV `which` program of a core: per band its lead, then its n blocks as a loop over
    'w' behind the band's address head."""
    body = []
    for band, n, head in segments:
        inner = band.aic if which < 0 else band.aiv[which]
        if n and inner:
            if 0 <= which < len(band.lead):
                body.extend(band.lead[which])
            body.append(Loop(n, (head,) + inner, "w"))
    return Program(core_kind, tuple(body))


def _group(segments: list[tuple[Band, int, Instr]], index: int, copies: int, flags: dict[str, int]) -> Group:
    bands = [b for b, _, _ in segments]
    aic = _program("aic", -1, segments) if any(b.aic for b in bands) else None
    naiv = max((len(b.aiv) for b in bands), default=0)
    aiv = tuple(_program("aiv", i, segments) for i in range(naiv))
    return Group(aic, aiv, copies=copies, flags=dict(flags), index=index)
