"""A request's KV cache crossing from its prefill instance to its decode instance, as the hardware moves it.

Each die of the prefill rank that holds a distinct shard of the request's cache (a CP chunk, a pipeline stage's
layers, a slice of GQA's KV heads) writes it to the decode die that holds the same shard; a die that holds a replica
(MLA's latent under attention TP) receives a whole shard of its own, in parallel with the others. The transfer
engine (Mooncake / HIXL device-to-device writes, SGLang's mooncake and ascend backends, vLLM-Ascend's
MooncakeConnector) moves each shard through three servers: the sender die's port on the tier joining the pools
(egress), the path between the two dies (link: one HCCS link of an A2 full mesh, the whole port on a switched
tier) and the receiver die's port (ingress), each at the chip's calibrated `efficiency.link` (HIXL D2D, K26).
Alone, a transfer of B bytes takes

    per_request + latency + blocks x per_block + B / min(senders x egress, flows x link, receivers x ingress)

where a block is one contiguous buffer of the engine's batch (a layer's cache, per cache kind, on each receiver)
and the fixed costs are the system's `kv_transfer`. Under load the serving simulation queues transfers on each
sender's egress and each receiver's ingress, so several requests landing on one decode rank take turns.
Limits: shards are taken as equal; a die's port is not shared with the collectives of the step it runs; V4's
sliding-window ring is not counted in the bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

from npusim.errors import NpusimError
from npusim.graph.accounting import cache_footprint
from npusim.spec.model import ModelConfig
from npusim.spec.plan import Instance, Plan
from npusim.spec.quant import QuantScheme
from npusim.spec.system import System


@dataclass(frozen=True)
class TransferPath:
    """The path one request's cache takes: per-die rates (bytes/s), shard counts and fixed costs (s)."""

    tier: str
    egress: float
    link: float
    ingress: float
    senders: int  # prefill dies holding distinct shards
    receivers: int  # decode dies holding distinct shards (of each replica)
    latency: float  # the tier's one-way latency plus the backend's per-request and per-block costs
    bytes_per_token: float  # the request's whole cache per token, every shard

    @property
    def bandwidth(self) -> float:
        """Bytes/s of one request's cache moving alone: the slowest of the three servers, over its parallel dies."""
        flows = max(self.senders, self.receivers)
        return min(self.senders * self.egress, flows * self.link, self.receivers * self.ingress)

    def bound(self, tokens: float) -> float:
        """The time no transfer of `tokens` tokens' cache can beat: its bytes at the slowest server's rate."""
        return tokens * self.bytes_per_token / self.bandwidth

    def time(self, tokens: float) -> float:
        """Seconds to move `tokens` tokens of one request's cache, alone on the path."""
        return self.latency + self.bound(tokens) if tokens > 0 else 0.0


def shards(model: ModelConfig, inst: Instance) -> int:
    """Dies of one attention-DP group that hold distinct parts of a sequence's cache: pipeline stages, CP chunks,
    GQA KV-head slices (up to the KV heads; replicas beyond them), as `parallel.memory.kv_bytes` counts them."""
    heads = min(inst.attention.tp, model.num_key_value_heads) if model.is_gqa else 1
    return inst.pp * inst.attention.cp * heads


def kv_path(model: ModelConfig, plan: Plan, system: System, quant: QuantScheme) -> TransferPath:
    """The prefill-to-decode path of a disaggregated plan on `system`, for caches stored as `quant` says."""
    pre, dec = plan.instance("prefill"), plan.instance("decode")
    span = pre.ranks * pre.instances + dec.ranks * dec.instances
    name = plan.kv_transfer_tier or system.tier_for(span)[0]
    if name not in system.tiers:
        raise NpusimError(f"'{name}' is not a tier of {system.name} ({', '.join(system.tiers)})",
                          file=plan.provenance.file, field="kv_transfer_tier")
    tier, eff = system.tiers[name], system.chip_spec.efficiency.link
    fp = cache_footprint(model, quant)
    receivers = shards(model, dec)
    blocks = (2 if model.has_indexer else 1) * model.num_hidden_layers / dec.pp  # cache kinds x layers, one receiver
    cost = system.kv_transfer
    fixed = cost.per_request + blocks * cost.per_block if cost else 0.0
    return TransferPath(name, egress=tier.bandwidth * eff, link=tier.pair_bandwidth * eff,
                        ingress=tier.bandwidth * eff, senders=shards(model, pre), receivers=receivers,
                        latency=tier.latency + fixed, bytes_per_token=fp.bytes_per_token)


def exposed(path: TransferPath, chunks: list[tuple[int, float]]) -> float:
    """Transfer time left after the prefill ends when each chunk's cache is sent as soon as its forward ends
    (SGLang's send_kv_chunk; one chunk: the whole cache after the prefill): `chunks` is (tokens, end time) of each
    chunk in order, from the prefill's start. Sends queue on the same ports, one after another."""
    free = 0.0
    for tokens, end in chunks:
        free = max(free, end) + path.time(tokens)
    return free - chunks[-1][1] if chunks else 0.0
