"""Step times of one rank: the only thing the serving simulation asks of the kernel/engine stack.

The serving layer never computes a latency itself. It asks a `StepModel` how long one prefill (or chunked-prefill)
step and one decode step of a given shape take, and what one rank can hold. `npusim predict` provides the real
model; `AnalyticStepModel` is a closed-form stand-in for tests; `GridStepModel` wraps any slow model so that a
serving run costs a few hundred predictions instead of one per step.

Units: seconds, bytes, tokens. Every shape is that of ONE attention-DP rank: an instance is `ranks` such ranks
stepping together (they meet in every MoE all-to-all), so the instance's step lasts as long as its busiest rank's.
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from npusim.errors import NpusimError


@dataclass(frozen=True)
class Capacity:
    """What one rank holds and does per step: fixes admission, preemption and how batches are formed."""

    kv_bytes_per_token: float  # KV cache plus indexer cache of one token, all layers, on this rank
    kv_capacity: float  # bytes of HBM left for that cache on this rank after weights, activations and buffers
    max_batch: int  # sequences a rank runs at once (vLLM max_num_seqs)
    token_budget: int  # prompt-chunk plus decode tokens a rank computes per step (vLLM max_num_batched_tokens)

    def __post_init__(self):
        for name in ("kv_bytes_per_token", "kv_capacity", "max_batch", "token_budget"):
            if not getattr(self, name) > 0:
                raise NpusimError(f"must be positive, got {getattr(self, name)!r}", field=f"capacity.{name}")

    @property
    def kv_tokens(self) -> int:
        """Tokens of KV cache one rank holds."""
        return int(self.kv_capacity // self.kv_bytes_per_token)


@runtime_checkable
class StepModel(Protocol):
    """Times of one rank's step. Must be deterministic and non-decreasing in every argument."""

    capacity: Capacity

    def prefill_time(self, new_tokens: int, cached_tokens: int, batch: int) -> float:
        """Seconds for a prefill step of `batch` sequences computing `new_tokens` prompt tokens in total, on top of
        `cached_tokens` in total already in the KV cache (prefix-cache hits and earlier chunks)."""
        ...

    def decode_time(self, batch: int, context: int, tokens_per_seq: int = 1) -> float:
        """Seconds for a decode step of `batch` sequences at mean `context` tokens (the token being decoded
        included), each verifying `tokens_per_seq` tokens (1 + MTP draft depth)."""
        ...


@dataclass(frozen=True)
class AnalyticStepModel:
    """Roofline of a rank's step: max(compute, memory traffic) plus a fixed per-step overhead.

    Stands in for `npusim predict` in tests and examples; the defaults are illustrative (a DeepSeek-class MoE rank
    with sparse attention), not calibrated. Attention reads at most `attended_cap` tokens per query (DSA top-k;
    None = dense) while the indexer scans the whole context.
    """

    capacity: Capacity
    flops: float = 250e12  # sustained FLOP/s of the rank
    bandwidth: float = 1.2e12  # sustained HBM bytes/s of the rank
    weight_bytes: float = 12e9  # weights the rank reads once per step
    flops_per_token: float = 2 * 37e9 / 16  # dense + active-expert FLOPs of one token on this rank
    attention_flops_per_pair: float = 4 * 61 * 576  # FLOPs per (query token, attended token) pair, all layers
    attended_cap: int | None = 2048
    indexer_bytes_per_token: float = 0.0  # indexer-key bytes scanned per context token per sequence
    overhead: float = 1e-3  # launch and synchronisation per step

    def _attended(self, context: float) -> float:
        return context if self.attended_cap is None else min(context, self.attended_cap)

    def prefill_time(self, new_tokens: int, cached_tokens: int, batch: int) -> float:
        per_seq_new, per_seq_cached = new_tokens / batch, cached_tokens / batch
        pairs = new_tokens * self._attended(per_seq_cached + per_seq_new / 2)
        compute = new_tokens * self.flops_per_token + pairs * self.attention_flops_per_pair
        memory = self.weight_bytes + (new_tokens + cached_tokens) * self.capacity.kv_bytes_per_token
        return self.overhead + max(compute / self.flops, memory / self.bandwidth)

    def decode_time(self, batch: int, context: int, tokens_per_seq: int = 1) -> float:
        tokens = batch * tokens_per_seq
        compute = tokens * (self.flops_per_token + self._attended(context) * self.attention_flops_per_pair)
        memory = self.weight_bytes + batch * (self._attended(context) * self.capacity.kv_bytes_per_token
                                              + context * self.indexer_bytes_per_token)
        return self.overhead + max(compute / self.flops, memory / self.bandwidth)


def _log_nodes(points_per_octave: int, top: int = 2**40) -> tuple[int, ...]:
    """0 and the distinct integers round(2**(k/points_per_octave)) up to `top`: dense where steps are small."""
    nodes = {0}
    k = 0
    while (n := round(2 ** (k / points_per_octave))) <= top:
        nodes.add(n)
        k += 1
    return tuple(sorted(nodes))


@dataclass(frozen=True)
class GridStepModel:
    """A slow StepModel memoised on a log-spaced grid and interpolated multilinearly between grid nodes.

    Why: a serving run takes ~10^5 steps and a prediction ~1 s. Nodes are evaluated lazily (a run pays only for
    the cells it visits) and cached for the life of this object. The interpolation is exact at nodes, deterministic,
    and non-decreasing along each axis wherever the wrapped model is. `tokens_per_seq` is an exact axis.
    """

    model: StepModel
    points_per_octave: int = 4
    _nodes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # grid node -> wrapped time
    _seen: dict = field(default_factory=dict, init=False, repr=False, compare=False)  # query -> interpolated time
    _tops: dict = field(init=False, repr=False, compare=False)  # per phase, the rank's limit on each axis

    def __post_init__(self):
        if self.points_per_octave < 1:
            raise NpusimError(f"must be at least 1, got {self.points_per_octave}", field="points_per_octave")
        object.__setattr__(self, "_nodes", _log_nodes(self.points_per_octave))
        cap = self.model.capacity
        object.__setattr__(self, "_tops", {"prefill": (cap.kv_tokens, cap.kv_tokens, cap.max_batch),
                                           "decode": (cap.max_batch, cap.kv_tokens, None)})

    @property
    def capacity(self) -> Capacity:
        return self.model.capacity

    @property
    def evaluations(self) -> int:
        """Calls made to the wrapped model so far."""
        return len(self._memo)

    def _bracket(self, x: float, top: int | None) -> tuple[int, int, float]:
        """The grid nodes around x and x's fractional position between them (lo == hi when x is on the grid).
        The rank's limit `top` is a node too, so the wrapped model is never asked for a shape the rank cannot hold;
        top None marks an exact axis."""
        if top is None or x == top:
            return int(x), int(x), 0.0
        nodes = self._nodes
        i = bisect_right(nodes, x) - 1
        lo = nodes[i]
        if lo == x:
            return lo, lo, 0.0
        hi = top if nodes[i + 1] > top > x else nodes[i + 1]
        return lo, hi, (x - lo) / (hi - lo)

    def _node(self, key: tuple) -> float:
        value = self._memo.get(key)
        if value is None:
            phase, a, b, c = key
            value = (self.model.prefill_time(a, b, c) if phase == "prefill" else self.model.decode_time(a, b, c))
            self._memo[key] = value
        return value

    def _interpolate(self, phase: str, x: float, y: float, z: float) -> float:
        """Nested linear interpolation, each as lo + w * (hi - lo): exact where nodes are equal, so rounding can
        never make the result decrease."""
        query = (phase, x, y, z)
        value = self._seen.get(query)
        if value is None:
            brackets = [self._bracket(v, top) for v, top in zip((x, y, z), self._tops[phase])]
            value = self._lerp(phase, brackets, ())
            self._seen[query] = value
        return value

    def _lerp(self, phase: str, brackets: list, fixed: tuple) -> float:
        if len(fixed) == len(brackets):
            return self._node((phase, *fixed))
        lo, hi, w = brackets[len(fixed)]
        low = self._lerp(phase, brackets, (*fixed, lo))
        return low if lo == hi else low + w * (self._lerp(phase, brackets, (*fixed, hi)) - low)

    def prefill_time(self, new_tokens: int, cached_tokens: int, batch: int) -> float:
        return self._interpolate("prefill", new_tokens, cached_tokens, batch)

    def decode_time(self, batch: int, context: int, tokens_per_seq: int = 1) -> float:
        return self._interpolate("decode", batch, context, tokens_per_seq)
