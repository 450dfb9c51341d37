"""What is deployed: instances and their attention-DP ranks, the prefill-to-decode link, and the scheduler."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from npusim.errors import NpusimError


def _positive(obj, *names: str) -> None:
    for name in names:
        value = getattr(obj, name)
        if not value > 0:
            raise NpusimError(f"must be positive, got {value!r}", field=f"{type(obj).__name__.lower()}.{name}")


@dataclass(frozen=True)
class Pool:
    """Identical instances serving one phase (both when co-located). An instance is `ranks` attention-DP ranks,
    each with its own batch and KV cache, stepping together."""

    instances: int = 1
    ranks: int = 1

    def __post_init__(self):
        _positive(self, "instances", "ranks")


@dataclass(frozen=True)
class Link:
    """The path a request's KV (and indexer) cache takes from its prefill rank to its decode rank: the rate of one
    request's cache alone (the slowest of sender egress, link and receiver ingress, `parallel.transfer`) and its fixed
    cost per transfer. Each prefill rank's egress and each decode rank's ingress is one server: transfers through a
    rank go one at a time, first come first served, so requests landing on one decode rank at once take turns.
    `bytes_per_token`: a token's cache, every shard (None: the prefill rank's per-die share, a rate per die)."""

    bandwidth: float  # bytes/s
    latency: float = 0.0  # s per transfer
    bytes_per_token: float | None = None
    layers: int = 1  # layers of cache one receiver takes (a layerwise push leaves the last one's share)

    def __post_init__(self):
        _positive(self, "bandwidth")
        if self.latency < 0:
            raise NpusimError(f"must not be negative, got {self.latency}", field="link.latency")
        if self.bytes_per_token is not None and not self.bytes_per_token > 0:
            raise NpusimError(f"must be positive, got {self.bytes_per_token!r}", field="link.bytes_per_token")

    def time(self, tokens: int, per_die_bytes: float) -> float:
        """Seconds `tokens` tokens of one request's cache take alone on the link."""
        per_token = per_die_bytes if self.bytes_per_token is None else self.bytes_per_token
        return self.latency + tokens * per_token / self.bandwidth if tokens > 0 else 0.0


@dataclass(frozen=True)
class Mtp:
    """Multi-token prediction: each decode step verifies `depth` draft tokens, each accepted with `acceptance`.

    draw='sequential': drafts are checked in order and the first rejection discards the rest (speculative decoding);
    'binomial': the number accepted is Binomial(depth, acceptance). Either way a step emits 1 + accepted tokens.
    """

    depth: int = 0
    acceptance: float = 0.0
    draw: Literal["sequential", "binomial"] = "sequential"

    def __post_init__(self):
        if self.depth < 0:
            raise NpusimError(f"must not be negative, got {self.depth}", field="mtp.depth")
        if not 0.0 <= self.acceptance <= 1.0:
            raise NpusimError(f"must be within [0, 1], got {self.acceptance}", field="mtp.acceptance")
        if self.draw not in ("sequential", "binomial"):
            raise NpusimError(f"unknown draw '{self.draw}'; allowed: binomial, sequential", field="mtp.draw")

    @property
    def tokens_per_seq(self) -> int:
        return self.depth + 1

    def emitted(self, rng: np.random.Generator, batch: int) -> list[int]:
        """Tokens each of `batch` sequences emits in one decode step."""
        if self.depth == 0:
            return [1] * batch
        if self.draw == "binomial":
            accepted = rng.binomial(self.depth, self.acceptance, size=batch)
        elif self.acceptance >= 1.0:
            accepted = np.full(batch, self.depth)
        else:  # leading successes before the first rejection, at most depth
            accepted = np.minimum(rng.geometric(1.0 - self.acceptance, size=batch) - 1, self.depth)
        return (accepted + 1).tolist()


SCHEDULERS = ("vllm", "sglang")
CONNECTORS = ("pull", "layerwise")


@dataclass(frozen=True)
class Scheduler:
    """How a rank forms each step, named after the framework whose semantics it follows (read from their schedulers:
    vLLM v1 `Scheduler.schedule`, SGLang `Scheduler.get_next_batch_to_run` and `PrefillAdder`).

    vllm: one token budget per step (`max_num_batched_tokens`) that the running decodes spend first (1 + MTP tokens
      each); prompt chunks fill what is left, in the same (mixed) step. Without chunking a prompt must fit what the
      decodes leave, so a budget equal to the prompt length admits a prompt only when no decode runs.
    sglang: the budget (`max_prefill_tokens`, and `chunked_prefill_size` when chunking) counts prompt tokens only. A
      step is a prefill batch whenever a waiting or part-done prompt can be admitted (it runs alone: the decodes wait,
      unless `mixed_chunk`, SGLang's --enable-mixed-chunk, where they ride along and count against the budget), else a
      decode batch. The first prompt of a batch is admitted even beyond the budget; a prompt that does not fit the
      chunk budget is cut to it. Admission reserves the prompt plus min(output, 4096) tokens, and for every running
      request min(remaining output, 4096) x new_token_ratio, which starts at 0.7, falls by (0.7 - 0.098) / 600 per
      decode step to 0.098 and returns to 0.7 after a preemption (SGLANG_INIT_NEW_TOKEN_RATIO,
      _MIN_NEW_TOKEN_RATIO_FACTOR, _NEW_TOKEN_RATIO_DECAY_STEPS, _CLIP_MAX_NEW_TOKENS_ESTIMATION defaults).
    `prefill_delay`: SGLang's PrefillDelayer (SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE=1, a co-located DP-attention
      instance): every pass the DP ranks tell each other whether they could prefill; while some can and some cannot,
      the prefill is held (the ranks decode) for up to this many passes (SGLANG_PREFILL_DELAYER_MAX_DELAY_PASSES, 30 by
      default in SGLang), so the ranks' prefills run in the same steps instead of each stalling the others' decodes.
      0: off. Passes in which no rank decodes are idle polls, taken as instantaneous (the prefill is not held).
    `connector`: how a disaggregated request's cache reaches its decode rank. SGLang's (mooncake / ascend backends)
      always: the decode rank preallocates first (DecodePreallocQueue; the prefill's bootstrap queue waits for it),
      each chunk is sent as its forward ends, the prefill's token streams when the request joins the decode batch;
      the prealloc admits a request while its prompt plus 512 tokens for every active request (running, in transfer,
      this one: num_reserved_decode_tokens) fit the cache, and the running limit allows.
      vLLM-Ascend: 'pull' (MooncakeConnector: prefill first, then the decode allocates, pulls the whole cache and its
      first step gives the first token) or 'layerwise' (MooncakeLayerwiseConnector: the decode preallocates, the
      prefill pushes each layer as its forward writes it, so only the last layer's share is left when it ends).
    Limit: SGLang's ratio after a retraction is recomputed from the retracted batch; here it returns to its start.
    """

    policy: str = "vllm"
    mixed_chunk: bool = False
    prefill_delay: int = 0
    connector: str = "pull"

    INIT_RATIO: ClassVar[float] = 0.7
    MIN_RATIO: ClassVar[float] = 0.7 * 0.14
    DECAY: ClassVar[float] = (0.7 - 0.7 * 0.14) / 600
    CLIP: ClassVar[int] = 4096
    RESERVED_DECODE_TOKENS: ClassVar[int] = 512  # SGLang server_args num_reserved_decode_tokens (PD decode prealloc)

    def __post_init__(self):
        if self.policy not in SCHEDULERS:
            raise NpusimError(f"unknown scheduler '{self.policy}'; allowed: {', '.join(SCHEDULERS)}", field="--scheduler")
        if self.mixed_chunk and self.policy != "sglang":
            raise NpusimError("mixed chunks are SGLang's option (--enable-mixed-chunk); vLLM always mixes",
                              field="--mixed-chunk")
        if self.connector not in CONNECTORS or (self.connector == "layerwise" and self.policy != "vllm"):
            raise NpusimError(f"unknown KV connector '{self.connector}' for the {self.policy} scheduler; allowed: pull, "
                              "layerwise (vLLM-Ascend's MooncakeLayerwiseConnector)", field="--kv-connector")
        if self.prefill_delay < 0 or (self.prefill_delay and self.policy != "sglang"):
            raise NpusimError(f"the prefill delayer is SGLang's (SGLANG_SCHEDULER_DECREASE_PREFILL_IDLE) and counts "
                              f"passes (>= 0); got {self.prefill_delay} with the {self.policy} scheduler",
                              field="--prefill-delay")

    @staticmethod
    def pre_alloc(running: int) -> int:
        """SGLang PD decode: request slots beyond the running limit for requests preallocated or in transfer
        (model_runner's DecodeReqToTokenPool pre_alloc_size: twice the limit when it is at most 32, else none)."""
        return 2 * running if running <= 32 else 0

    @property
    def decodes_count(self) -> bool:
        """Whether the running decodes spend the step's token budget (and run in the prefill step)."""
        return self.policy == "vllm" or self.mixed_chunk


@dataclass(frozen=True)
class Deployment:
    """Instances and scheduler switches.

    Co-located (`decode` is None): the `prefill` pool runs both phases, mixing decode tokens and prompt chunks in one
    step. Disaggregated: prompts run on `prefill`, then each request's cache crosses `link` to a `decode` rank.
    `chunk_size` caps the prompt tokens of one sequence per step (chunked prefill); None prefills a prompt whole.
    `kv_headroom` is the fraction of a rank's KV cache kept free when admitting, so running sequences can grow.
    `scheduler` forms the steps (vLLM or SGLang semantics).
    """

    prefill: Pool = field(default_factory=Pool)
    decode: Pool | None = None
    link: Link | None = None
    chunk_size: int | None = None
    mtp: Mtp = field(default_factory=Mtp)
    kv_headroom: float = 0.01
    scheduler: Scheduler = field(default_factory=Scheduler)

    def __post_init__(self):
        if self.decode is not None and self.link is None:
            raise NpusimError("a disaggregated deployment (decode pool given) needs the prefill-to-decode link",
                              field="deployment.link")
        if self.chunk_size is not None and self.chunk_size < 1:
            raise NpusimError(f"must be at least 1 token, got {self.chunk_size}", field="deployment.chunk_size")
        if not 0.0 <= self.kv_headroom < 1.0:
            raise NpusimError(f"must be a fraction in [0, 1), got {self.kv_headroom}", field="deployment.kv_headroom")

    @property
    def disaggregated(self) -> bool:
        return self.decode is not None
