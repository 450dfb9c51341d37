"""A system: how many chips of which kind, and the tiers of interconnect that join their ranks.

Tiers are listed innermost first; a tier's `size` is how many ranks (dies) share one domain of it, so the tier a
collective runs on is the innermost one whose domain holds the whole group.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from npusim.errors import NpusimError, did_you_mean
from npusim.spec.catalog import Catalog, Provenance
from npusim.spec.chip import CHIPS, Chip, load_chip
from npusim.spec.schema import count, internal, quantity, ratio, table, text

TOPOLOGIES = ("on-package", "full-mesh", "clos", "switch", "fat-tree")


@dataclass(frozen=True, kw_only=True)
class Tier:
    description: str = text(default="")
    topology: str = text(choices=TOPOLOGIES)
    size: int = count(doc="ranks per domain of this tier")
    bandwidth: float = quantity("bandwidth", doc="per rank, per direction")
    latency: float = quantity("time", doc="one-way latency of a small message, end to end")
    setup: float = quantity("time", minimum=0.0, strict=False,
                            doc="fixed software cost of starting one collective (HCCL op expansion, handshakes)")
    links_per_rank: int = count(default=1)

    @property
    def pair_bandwidth(self) -> float:
        """Per direction between two ranks: one link of a full mesh, the whole port on a switched tier."""
        return self.bandwidth / self.links_per_rank if self.topology == "full-mesh" else self.bandwidth


HCCL_KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all")


@dataclass(frozen=True, kw_only=True)
class Hccl:
    """How HCCL runs the collectives of a group inside one node (AIV expansion mode, HCCL_OP_EXPANSION_MODE=AIV):
    a collective whose per-rank data fits `aiv_entry` is one kernel on the vector cores; a larger one is expanded by
    the AI CPU into a ring of DMA steps, which starts later. Both move data at `efficiency` of the tiers' bandwidth
    (timing in npusim.parallel.collectives)."""

    aiv_entry: dict[str, float] = table(quantity("bytes"), keys=HCCL_KINDS,
                                        doc="largest per-rank data of the one-kernel AIV path, per collective kind")
    aiv_setup: float = quantity("time", minimum=0.0, strict=False, doc="fixed cost of an AIV-path collective")
    aicpu_setup: float = quantity("time", minimum=0.0, strict=False, doc="fixed cost of an AI CPU-expanded one")
    efficiency: float = ratio(doc="fraction of the tiers' bandwidth an HCCL collective moves data at")


@dataclass(frozen=True, kw_only=True)
class KvTransfer:
    """Fixed costs of moving one request's KV cache between two pools with the transfer engine the serving
    frameworks use on this system (Mooncake / HIXL device-to-device writes; timing in npusim.parallel.transfer)."""

    per_request: float = quantity("time", minimum=0.0, strict=False,
                                  doc="a request's handshake, batch submit and completion notify")
    per_block: float = quantity("time", minimum=0.0, strict=False,
                                doc="one contiguous block (a layer's cache buffer) in the engine's batch")


@dataclass(frozen=True, kw_only=True)
class System:
    name: str = text()
    description: str = text(default="")
    chip: str = text(doc="name of the chip file in hardware/chips")
    chips: int = count(doc="packages in the system")
    chips_per_node: int = count()
    tiers: dict[str, Tier]
    hccl: Hccl | None = None
    kv_transfer: KvTransfer | None = None
    host_link: float = quantity("bandwidth", doc="host <-> device per rank, per direction (KV offload)")
    power_per_chip: float = quantity("power", doc="all-in system power per package (CPUs, switches, optics)")
    price_per_chip: float = quantity("money", doc="all-in system price per package")
    provenance: Provenance = internal()
    chip_spec: Chip = internal()

    @property
    def ranks(self) -> int:
        return self.chips * self.chip_spec.dies

    @property
    def ranks_per_node(self) -> int:
        return self.chips_per_node * self.chip_spec.dies

    def tier_for(self, group: int) -> tuple[str, Tier]:
        """The innermost tier whose domain holds a group of `group` consecutive ranks."""
        for name, tier in self.tiers.items():
            if group <= tier.size:
                return name, tier
        raise NpusimError(f"a group of {group} ranks is larger than {self.name} ({self.ranks} ranks)")

    def check(self) -> list[tuple[str, str]]:
        problems = []
        sizes = [t.size for t in self.tiers.values()]
        if sizes != sorted(sizes):
            problems.append(("tiers", "must be listed innermost first (domain sizes non-decreasing)"))
        if self.chips % self.chips_per_node:
            problems.append(("chips", f"{self.chips} is not a multiple of chips_per_node ({self.chips_per_node})"))
        return problems


SYSTEMS = Catalog("system", "hardware/systems", System)
_SYSTEM_FIELDS = {f.name for f in dataclasses.fields(System)}


def split_overrides(overrides: dict[str, str] | None) -> tuple[dict[str, str], dict[str, str]]:
    """Route `--set` keys: a System field path goes to the system, anything else to its chip."""
    system, chip = {}, {}
    for key, value in (overrides or {}).items():
        head = key.split(".", 1)[0]
        (system if head in _SYSTEM_FIELDS and head != "chip" else chip)[key.removeprefix("chip.")] = value
    return system, chip


def load_system(name: str, overrides: dict[str, str] | None = None) -> System:
    sys_over, chip_over = split_overrides(overrides)
    system = SYSTEMS.load(name, sys_over)
    if system.chip not in CHIPS.names():
        raise NpusimError(f"names unknown chip '{system.chip}'" + did_you_mean(system.chip, CHIPS.names()),
                          file=system.provenance.files.get("chip", system.provenance.file), field="chip")
    chip = load_chip(system.chip, chip_over)
    return dataclasses.replace(system, chip_spec=chip)
