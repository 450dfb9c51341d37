"""Request-level discrete-event simulation (simpy) of a deployment under a load.

Each instance is one simpy process that repeats: every rank forms its batch (continuous batching in the style of
vLLM / SGLang), the step lasts as long as the slowest rank's (the ranks meet in every MoE all-to-all), then tokens
are emitted. Time advances one step at a time, never one token at a time, so a run costs O(steps x batch).

Scheduling on a rank, per step, with the semantics of the framework the deployment's `Scheduler` names:
  - decode: every decoding sequence verifies 1 + MTP-depth tokens; if the KV cache cannot take them, the most
    recently admitted sequence is preempted (its cache freed, recomputed later from its prompt plus the tokens it
    has produced) until it can;
  - prefill: sequences part-way through their prompt get their next chunk, then waiting requests are admitted in
    arrival order while the running limit, the token budget and the KV cache allow. Admission holds the whole
    prompt's cache; prefix-cache hits are already there and are not recomputed.
  vLLM runs both in one (mixed) step, the decodes first and spending the budget; SGLang runs a prefill batch alone
  whenever a prompt can be admitted (the decodes wait) and a decode batch otherwise (see `Scheduler`).
  SGLang's prefill delayer (`Scheduler.prefill_delay`) holds the prompts of every rank while some ranks could
  prefill and others could not, up to that many passes, so the ranks prefill in the same steps.
A mixed step (co-located instances) costs its prefill part plus its decode part. The last prompt chunk computes the
first token. Disaggregated, each framework's PD flow (`Scheduler.connector`):
  - SGLang (mooncake / ascend backends): the request first waits in a decode rank's prealloc queue until its prompt's
    cache (beside 512 reserved tokens per active request, in the running limit plus SGLang's pre-allocation slots)
    is reserved, then prefills; each chunk's cache is sent as the chunk ends; the prefill rank keeps the request's
    slot and cache until the last send lands; the request joins the decode batch at the next step boundary, when the
    prefill's token streams to the user.
  - vLLM-Ascend 'pull' (MooncakeConnector): prefill first; the request then waits for a decode slot, the decode rank
    pulls the whole cache, and its first step (recomputing the prompt's last token) gives the first token.
    'layerwise' (MooncakeLayerwiseConnector): preallocated first, each layer pushed during the prefill's forward.
  Every transfer holds the prefill rank's egress and the decode rank's ingress (one simpy resource each), so caches
  landing on one decode rank take turns; a preempted decode sequence is recomputed on a prefill rank.
Requests and preempted sequences go to the rank with the least KV load (cache held plus prompts queued).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

import numpy as np
import pandas as pd
import simpy

from npusim.errors import NpusimError, did_you_mean
from npusim.progress import progress as progress_bar
from npusim.serving.deployment import Deployment, Scheduler
from npusim.serving.load import BLOCK, ClosedLoop, Load, OpenLoop, Shape, Trace
from npusim.serving.result import REQUEST_COLUMNS, STEP_COLUMNS, ServingResult, Slo
from npusim.serving.stepmodel import StepModel

WAITING, PREFILL, HANDOFF, TRANSFER, DECODE, DONE = "waiting", "prefill", "handoff", "transfer", "decode", "done"


IDLE = (0.0, (), ())  # the plan of a rank with nothing to do


class Request:
    """A request's progress through the deployment (mutable simulation state; the result keeps a table of it)."""

    __slots__ = ("id", "arrival", "input", "output", "prefix_hit", "prompt", "prefilled", "generated", "kv", "state",
                 "scheduled", "times", "tokens", "finish", "preemptions", "prefill_rank", "decode_rank", "holder", "done",
                 "admitted", "prefill_end", "kv_ready", "dest", "sending", "held")

    def __init__(self, id: int, arrival: float, shape: Shape):
        self.id, self.arrival = id, arrival
        self.input, self.output, self.prefix_hit = shape
        self.prompt = self.input  # tokens that must be in the cache before decoding (grows on recompute)
        self.prefilled = self.prefix_hit  # prompt tokens in the cache so far
        self.generated = 0
        self.kv = 0  # cache tokens held on its current rank
        self.state = WAITING
        self.scheduled: float | None = None  # first admission to a prefill step
        self.times: list[float] = []  # when each step emitted tokens of this request
        self.tokens: list[int] = []  # how many it emitted then (an MTP step may emit several)
        self.finish: float | None = None
        self.preemptions = 0
        self.prefill_rank = self.decode_rank = ""
        self.holder: Rank | None = None  # prefill rank holding the cache during the handoff
        self.done: simpy.Event | None = None  # closed loop: the user waits on it
        self.admitted = self.prefill_end = self.kv_ready = math.nan  # decode slot given; last chunk; cache landed
        self.dest: Rank | None = None  # the decode rank that preallocated the cache (SGLang PD)
        self.sending = 0  # chunk transfers in flight
        self.held = 0  # tokens computed but not yet delivered to the user (the first, until the decode rank has it)

    def emit(self, now: float, tokens: int) -> None:
        self.times.append(now)
        self.tokens.append(tokens)


class Rank:
    """One attention-DP rank: its own waiting queue, running batch and KV cache."""

    def __init__(self, instance: Instance, index: int, headroom: float):
        cap = instance.model.capacity
        self.instance = instance
        self.name = f"{instance.name}.r{index}"
        self.kv_tokens = cap.kv_tokens
        self.admit_limit = int(cap.kv_tokens * (1.0 - headroom))
        self.max_batch, self.token_budget = cap.max_batch, cap.token_budget
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # in admission order: the last is the first preempted
        self.kv_used = 0
        self.queued = 0  # cache tokens the waiting requests will need
        self.inbound = 0  # admitted requests whose cache is still crossing the link
        self.holding = 0  # prefilled requests whose cache this prefill rank still holds (SGLang's inflight queue)
        self.arrived: list[Request] = []  # caches landed, joining the running batch at the next step boundary
        self.prealloc: deque[Request] = deque()  # SGLang PD: requests waiting for this decode rank to reserve a slot
        self.port = simpy.Resource(instance.sim.env, capacity=1)  # this rank's egress (prefill) / ingress (decode)
        self.slots = self.max_batch  # request slots: running, preallocated and in transfer together
        if instance.role == "decode" and instance.sim.early_alloc and not instance.sim.layerwise:
            self.slots += Scheduler.pre_alloc(self.max_batch)
        self.ratio = Scheduler.INIT_RATIO  # SGLang's new_token_ratio (output reserved per running request)

    def load(self) -> int:
        return self.kv_used + self.queued

    def enqueue(self, r: Request, front: bool = False) -> None:
        need = r.kv if r.state is HANDOFF else r.prompt
        (self.waiting.appendleft if front else self.waiting.append)(r)
        self.queued += need
        self.instance.sim.count(waiting=1)
        self.instance.kick()

    def prefillable(self) -> bool:
        """Whether this rank would run prompt tokens now (a part-done prompt, or a waiting one it can admit)."""
        return any(r.state is PREFILL for r in self.running) or bool(
            self.waiting and len(self.running) + self.holding < self.max_batch and self.fits(self.waiting[0], 0))

    def plan(self, prefill: bool = True):
        """Form this step's batch: (seconds, decoding requests, [(prefilling request, prompt tokens)]); `prefill`
        False: the prompts are held this pass (SGLang's prefill delayer)."""
        if not self.running and not self.waiting and not self.prealloc:
            return IDLE
        inst, sched = self.instance, self.instance.sim.deployment.scheduler
        tps = inst.sim.deployment.mtp.tokens_per_seq
        prefill = prefill and inst.prefills
        if sched.decodes_count:  # vLLM (or SGLang mixed chunks): the decodes first, prompts in what they leave
            decodes = self.decode_batch(tps) if inst.decodes else []
            chunks = self.prefill_batch(len(decodes) * tps, bool(decodes)) if prefill else []
        else:  # SGLang: a prefill batch whenever a prompt can run, alone; else a decode batch
            chunks = self.prefill_batch(0, False) if prefill else []
            decodes = self.decode_batch(tps) if inst.decodes and not chunks else []
        if not inst.prefills:
            self.admit_prealloc() if inst.sim.early_alloc else self.admit_handoffs()
        seconds = 0.0
        if chunks:
            seconds += inst.model.prefill_time(sum(n for _, n in chunks), sum(r.prefilled for r, _ in chunks),
                                               len(chunks))
        if decodes:
            context = round(sum(r.kv for r in decodes) / len(decodes)) + 1
            seconds += inst.model.decode_time(len(decodes), context, tps)
        return seconds, decodes, chunks

    def decode_batch(self, tps: int) -> list[Request]:
        """The decoding sequences of this step; if the cache cannot take their tokens, the most recently admitted
        sequence is preempted until it can. vLLM caps them by the token budget, SGLang by the running limit only."""
        sched = self.instance.sim.deployment.scheduler
        decodes = [r for r in self.running if r.state is DECODE]
        while decodes and self.kv_used + len(decodes) * tps > self.kv_tokens:
            victim = self.running[-1]
            self.preempt(victim)
            if victim in decodes:
                decodes.remove(victim)
        if sched.policy == "vllm":
            del decodes[min(self.token_budget // tps, self.max_batch):]
        elif decodes:  # SGLang's new_token_ratio decays with every decode batch
            self.ratio = max(sched.MIN_RATIO, self.ratio - sched.DECAY)
        return decodes

    def prefill_batch(self, decode_tokens: int, decoding: bool) -> list[tuple[Request, int]]:
        """Prompt chunks of this step: part-done prompts first, then waiting requests in arrival order."""
        sched, size = self.instance.sim.deployment.scheduler, self.instance.sim.deployment.chunk_size
        budget = self.token_budget - decode_tokens
        chunk_left = size - decode_tokens if sched.policy == "sglang" and size is not None else None
        chunks: list[tuple[Request, int]] = []
        for r in self.running:
            if r.state is PREFILL:
                n = self.chunk(r, budget, chunk_left, bool(chunks) or decoding, waiting=False)
                if n == 0:
                    break
                chunks.append((r, n))
                budget -= n
                chunk_left = None if chunk_left is None else chunk_left - n
        self.admit_prompts(chunks, decode_tokens, decoding, budget, chunk_left)
        return chunks

    def chunk(self, r: Request, budget: int, chunk_left: int | None, shared: bool, waiting: bool) -> int:
        """Prompt tokens of r to run now (0: not this step).

        vLLM: a chunk of at most chunk_size when chunking, else the whole rest of the prompt, which may exceed the
        budget only when it runs alone. SGLang: a waiting prompt at least as long as the budget left waits for the
        next batch unless it would be the batch's first; the prompt is cut to the chunk budget left."""
        rest = r.prompt - r.prefilled
        if budget <= 0 or (chunk_left is not None and chunk_left <= 0):
            return 0
        if self.instance.sim.deployment.scheduler.policy == "sglang":
            if waiting and shared and rest >= budget:
                return 0
            return rest if chunk_left is None else min(rest, chunk_left)
        size = self.instance.sim.deployment.chunk_size
        if size is not None:
            return max(0, min(rest, size, budget))
        return rest if rest <= budget or not shared else 0

    def fits(self, r: Request, decode_tokens: int) -> bool:
        """Whether admitting r leaves the cache room it needs: the prompt beside this step's decode tokens, within
        the headroom while others run (vLLM; and any prefill-only rank, whose caches leave with their requests); on
        an SGLang rank that decodes, the prompt plus min(output, 4096) beside every running request's remaining
        output (clipped) times new_token_ratio."""
        sched = self.instance.sim.deployment.scheduler
        if sched.policy == "vllm" or not self.instance.decodes:
            return self.kv_used + decode_tokens + r.prompt <= (self.admit_limit if self.running else self.kv_tokens)
        reserved = self.ratio * sum(min(q.output - q.generated, sched.CLIP) for q in self.running)
        return self.kv_used + reserved + r.prompt + min(r.output - r.generated, sched.CLIP) <= self.kv_tokens

    def admit_prompts(self, chunks: list, decode_tokens: int, decoding: bool, budget: int,
                      chunk_left: int | None) -> None:
        now = self.instance.sim.env.now
        while self.waiting and len(self.running) + self.holding < self.max_batch:
            r = self.waiting[0]
            if not self.fits(r, decode_tokens):
                return
            n = self.chunk(r, budget, chunk_left, bool(chunks) or decoding, waiting=True)
            if n == 0:
                return
            self.waiting.popleft()
            self.queued -= r.prompt
            self.instance.sim.count(waiting=-1)
            r.kv = r.prompt
            self.kv_used += r.kv
            r.state = PREFILL
            r.prefill_rank = self.name
            if r.scheduled is None:
                r.scheduled = now
            self.running.append(r)
            chunks.append((r, n))
            budget -= n
            chunk_left = None if chunk_left is None else chunk_left - n

    def admit_handoffs(self) -> None:
        sim = self.instance.sim
        while self.waiting and self.occupied() < self.max_batch:
            r = self.waiting[0]
            if self.kv_used + r.kv > (self.admit_limit if self.occupied() else self.kv_tokens):
                return
            self.take(self.waiting, r.kv)
            r.state = TRANSFER
            sim.env.process(sim.transfer(r, self))

    def occupied(self) -> int:
        """A decode rank's request slots in use: running, in transfer, and landed waiting to join the batch."""
        return len(self.running) + self.inbound + len(self.arrived)

    def take(self, queue: deque[Request], tokens: int) -> Request:
        """Admit the head of `queue` with `tokens` of cache reserved on this rank; its cache is now inbound."""
        r = queue.popleft()
        self.queued -= tokens
        self.kv_used += tokens
        self.inbound += 1
        self.instance.sim.count(waiting=-1)
        r.decode_rank, r.admitted = self.name, self.instance.sim.env.now
        return r

    def reserve(self, r: Request, front: bool = False) -> None:
        """SGLang PD: r waits in this decode rank's prealloc queue; its prefill starts once a slot is reserved."""
        (self.prealloc.appendleft if front else self.prealloc.append)(r)
        self.queued += r.prompt
        self.instance.sim.count(waiting=1)
        self.admit_prealloc()

    def admit_prealloc(self) -> None:
        """SGLang's DecodePreallocQueue: reserve the prompt's cache while the running limit allows and the cache
        holds it beside num_reserved_decode_tokens for every active request (vLLM-Ascend's layerwise connector: the
        headroom kept while others run), then hand the request to a prefill rank (its bootstrap is done)."""
        sim = self.instance.sim
        reserve = 0 if sim.layerwise else Scheduler.RESERVED_DECODE_TOKENS
        while self.prealloc and self.occupied() < self.slots:
            r = self.prealloc[0]
            others = self.occupied()
            limit = self.admit_limit if others and sim.layerwise else self.kv_tokens
            if self.kv_used + r.prompt + (reserve * (others + 1) if others else 0) > limit:
                return
            self.take(self.prealloc, r.prompt).dest = self
            min(sim.entry, key=Rank.load).enqueue(r)

    def release(self, r: Request) -> None:
        """Give back a reservation whose request finished at its prefill (a one-token output)."""
        self.kv_used -= r.prompt
        self.inbound -= 1
        r.dest = None
        self.admit_prealloc()

    def join_arrived(self, now: float) -> None:
        """Requests whose cache has landed join the running batch at this step boundary (SGLang's transfer queue is
        polled once per scheduler pass); SGLang streams the prefill's token now, vLLM with its first decode step."""
        if not self.arrived:
            return
        room = max(0, self.max_batch - len(self.running))
        for r in self.arrived[:room]:
            r.state = DECODE
            self.running.append(r)
            if self.instance.sim.early_alloc:
                r.emit(now, r.held)
                r.held = 0
        del self.arrived[:room]

    def finish(self, decodes: list[Request], chunks: list[tuple[Request, int]], now: float) -> None:
        """Apply a finished step: emit tokens, complete requests, hand prompts over to decode."""
        if decodes:
            for r, e in zip(decodes, self.instance.sim.emitted(len(decodes))):
                if r.held:  # vLLM PD: the first step recomputes the prompt's last token, giving the first token
                    r.emit(now, r.held)
                    r.held = 0
                    continue
                e = min(e, r.output - r.generated)
                r.kv += e
                self.kv_used += e
                r.generated += e
                r.emit(now, e)
                if r.generated >= r.output:
                    self.complete(r, now)
        sim = self.instance.sim
        for r, n in chunks:
            if r.dest is not None and not sim.layerwise:  # SGLang: each chunk's cache is sent as its forward ends
                sim.send(r, self, n)  # (the decode side's radix cache holds the prefix)
            r.prefilled += n
            if r.prefilled < r.prompt:
                continue
            r.generated += 1
            r.prefill_end = now
            if r.generated >= r.output:
                r.emit(now, 1)
                if r.dest is not None:
                    r.dest.release(r)
                self.complete(r, now)
            elif self.instance.decodes:
                r.emit(now, 1)
                r.state = DECODE
            else:  # the token reaches the user with the cache, from the decode rank
                self.running.remove(r)
                r.state = HANDOFF
                r.holder = self
                self.holding += 1  # its request slot stays taken until the cache has left
                r.held = 1
                if r.dest is None:
                    sim.handoff(r)
                elif not r.sending:
                    sim.deliver(r)

    def complete(self, r: Request, now: float) -> None:
        self.running.remove(r)
        self.kv_used -= r.kv
        r.kv = 0
        r.state = DONE
        r.finish = now
        self.instance.sim.finished(r)

    def preempt(self, r: Request) -> None:
        """Free r's cache; it starts again from its prompt plus what it has produced (recompute)."""
        self.running.remove(r)
        self.kv_used -= r.kv
        r.kv = 0
        r.preemptions += 1
        r.prompt = r.input + r.generated
        r.prefilled = r.prefix_hit
        r.state = WAITING
        self.ratio = Scheduler.INIT_RATIO
        self.instance.sim.requeue(r, self)


class Instance:
    """Ranks that step together; `role` is 'prefill', 'decode' or 'both' (co-located)."""

    def __init__(self, sim: _Simulation, name: str, role: str, model: StepModel, ranks: int):
        self.sim, self.name, self.role, self.model = sim, name, role, model
        self.prefills = role in ("prefill", "both")
        self.decodes = role in ("decode", "both")
        self.ranks = [Rank(self, i, sim.deployment.kv_headroom) for i in range(ranks)]
        self.kv_total = sum(rank.kv_tokens for rank in self.ranks)
        self.wake = sim.env.event()
        self.delayed = 0  # passes the prefill delayer has held the prompts so far

    def allow_prefill(self) -> bool:
        """SGLang's PrefillDelayer negotiation, once per pass: hold the prompts while some ranks could prefill and
        others could not, for at most `prefill_delay` passes (the last one lets them through)."""
        passes = self.sim.deployment.scheduler.prefill_delay
        if not passes or not (self.prefills and self.decodes):
            return True
        ready = [rank.prefillable() for rank in self.ranks]
        decoding = any(r.state is DECODE for rank in self.ranks for r in rank.running)
        if any(ready) and not all(ready) and decoding and self.delayed < passes - 1:
            self.delayed += 1
            return False
        self.delayed = 0
        return True

    def kick(self) -> None:
        if not self.wake.triggered:
            self.wake.succeed()

    def run(self):
        env, log = self.sim.env, self.sim.steps
        while True:
            for rank in self.ranks:
                rank.join_arrived(env.now)
            prefill = self.allow_prefill()
            plans = [rank.plan(prefill) for rank in self.ranks]
            seconds = max(p[0] for p in plans)
            if seconds == 0.0:  # nothing runnable: sleep until a request, a preempted sequence or a cache arrives
                self.wake = env.event()
                yield self.wake
                continue
            log.append((env.now, self.name, self.role, seconds,
                        sum(len(p[1]) + len(p[2]) for p in plans),
                        sum(n for p in plans for _, n in p[2]),
                        sum(len(p[1]) for p in plans),
                        sum(len(rank.waiting) for rank in self.ranks),
                        sum(rank.kv_used for rank in self.ranks) / self.kv_total))
            if self.sim.layerwise:  # each layer's cache leaves as the forward writes it
                for rank, (_, _, chunks) in zip(self.ranks, plans):
                    for r, n in chunks:
                        self.sim.send(r, rank, n, env.now + seconds)
            yield env.timeout(seconds)
            for rank, (_, decodes, chunks) in zip(self.ranks, plans):
                rank.finish(decodes, chunks, env.now)


class _Simulation:
    def __init__(self, deployment: Deployment, load: Load, models: dict[str, StepModel], seed: int,
                 requests: int | None, duration: float | None, progress: bool):
        load_seed, mtp_seed = np.random.SeedSequence(seed).spawn(2)
        self.load_rng, self.mtp_rng = np.random.default_rng(load_seed), np.random.default_rng(mtp_seed)
        self.deployment, self.load = deployment, load
        self.limit, self.duration, self.progress = requests, duration, progress
        self.env = simpy.Environment()
        # SGLang PD and vLLM-Ascend's layerwise connector: the decode rank preallocates before the prefill starts
        sched = deployment.scheduler
        self.layerwise = deployment.disaggregated and sched.connector == "layerwise"
        self.early_alloc = deployment.disaggregated and (sched.policy == "sglang" or self.layerwise)
        self.requests: list[Request] = []
        self.arrived = 0  # open-loop arrivals so far (a capped client may not have sent them yet)
        self.steps: list[tuple] = []
        self.completed = 0
        self.drafts: list[int] = []  # MTP tokens emitted per sequence-step, drawn in blocks and consumed in order
        self.waiting = self.in_system = 0  # requests waiting for admission / arrived and not finished
        self.waiting_area = self.in_system_area = 0.0  # their integrals over time
        self.stamp = 0.0
        if deployment.disaggregated:
            self.prefill = [Instance(self, f"p{k}", "prefill", models["prefill"], deployment.prefill.ranks)
                            for k in range(deployment.prefill.instances)]
            self.decode = [Instance(self, f"d{k}", "decode", models["decode"], deployment.decode.ranks)
                           for k in range(deployment.decode.instances)]
        else:
            self.prefill = self.decode = [Instance(self, f"i{k}", "both", models["prefill"], deployment.prefill.ranks)
                                          for k in range(deployment.prefill.instances)]
        self.entry = [rank for inst in self.prefill for rank in inst.ranks]
        self.exits = [rank for inst in self.decode for rank in inst.ranks]
        self.fits = min(rank.kv_tokens for rank in self.entry + self.exits) - deployment.mtp.depth
        tps = deployment.mtp.tokens_per_seq
        if self.exits[0].token_budget < tps:
            raise NpusimError(f"a decode step needs {tps} tokens per sequence (1 + MTP depth) but the token budget "
                              f"is {self.exits[0].token_budget}", field="capacity.token_budget")

    def submit(self, shape: Shape) -> Request:
        r = Request(len(self.requests), self.env.now, shape)
        if r.input + r.output > self.fits:
            raise NpusimError(f"request {r.id} needs {r.input + r.output} tokens of KV cache (input {r.input} + "
                              f"output {r.output}) but a rank holds {self.fits}; shorten it or give ranks more memory",
                              field="load")
        self.requests.append(r)
        self.count(in_system=1)
        if self.early_alloc:
            min(self.exits, key=Rank.load).reserve(r)
        else:
            min(self.entry, key=Rank.load).enqueue(r)
        return r

    def handoff(self, r: Request) -> None:
        min(self.exits, key=Rank.load).enqueue(r)

    def requeue(self, r: Request, rank: Rank) -> None:
        if rank.instance.prefills:
            rank.enqueue(r, front=True)
        elif self.early_alloc:  # a retracted request bootstraps again
            min(self.exits, key=Rank.load).reserve(r, front=True)
        else:
            min(self.entry, key=Rank.load).enqueue(r, front=True)

    def move(self, src: Rank, dst: Rank, tokens: int):
        """`tokens` tokens of cache through the sender's egress and the receiver's ingress, one transfer at a time
        on each (the egress is held while the ingress is busy)."""
        seconds = self.deployment.link.time(tokens, src.instance.model.capacity.kv_bytes_per_token)
        with src.port.request() as out:
            yield out
            with dst.port.request() as into:
                yield into
                yield self.env.timeout(seconds)

    def transfer(self, r: Request, dst: Rank):
        """vLLM PD: the decode rank, having allocated r's blocks, pulls its whole cache from the prefill rank."""
        yield from self.move(r.holder, dst, r.kv - r.prefix_hit)  # the prefix is in the decode side's cache
        self.deliver(r, dst)

    def send(self, r: Request, src: Rank, tokens: int, forward_end: float | None = None) -> None:
        """Ship `tokens` tokens of r's cache to the rank that preallocated it; a layerwise push starts with the
        forward (`forward_end`: when it ends) and cannot land before the last layer's share has followed it."""
        r.sending += 1
        self.env.process(self._send(r, src, tokens, forward_end))

    def _send(self, r: Request, src: Rank, tokens: int, forward_end: float | None):
        dst = r.dest
        yield from self.move(src, dst, tokens)
        if forward_end is not None:
            link = self.deployment.link
            tail = link.time(tokens, src.instance.model.capacity.kv_bytes_per_token) - link.latency
            last = forward_end + link.latency + tail / link.layers
            if last > self.env.now:
                yield self.env.timeout(last - self.env.now)
        r.sending -= 1
        if not r.sending and r.state is HANDOFF:
            self.deliver(r)

    def deliver(self, r: Request, dst: Rank | None = None) -> None:
        """r's cache has landed on `dst` (SGLang: the rank that preallocated it): the prefill rank frees its copy; r
        joins the decode rank's running batch at its next step."""
        src, dst = r.holder, dst or r.dest
        src.kv_used -= r.kv
        src.holding -= 1
        r.holder, r.dest = None, None
        src.instance.kick()
        r.kv_ready = self.env.now
        r.state = TRANSFER
        dst.inbound -= 1
        dst.arrived.append(r)
        dst.instance.kick()

    def emitted(self, batch: int) -> list[int]:
        """Tokens each of `batch` decoding sequences emits this step."""
        if len(self.drafts) < batch:
            self.drafts = self.deployment.mtp.emitted(self.mtp_rng, max(batch, BLOCK))[::-1] + self.drafts
        taken = self.drafts[-batch:]
        del self.drafts[-batch:]
        return taken

    def count(self, waiting: int = 0, in_system: int = 0) -> None:
        """Keep the exact time integrals of the number waiting and the number in the system."""
        dt = self.env.now - self.stamp
        self.waiting_area += self.waiting * dt
        self.in_system_area += self.in_system * dt
        self.stamp = self.env.now
        self.waiting += waiting
        self.in_system += in_system

    def finished(self, r: Request) -> None:
        self.completed += 1
        self.count(in_system=-1)
        if r.done is not None:
            r.done.succeed()
        self.bar.update()
        if self.completed % 100 == 0:
            self.bar.set_postfix_str(f"t = {self.env.now:.1f} s", refresh=False)

    def open_loop(self, arrivals):
        cap = self.load.max_concurrency if isinstance(self.load, OpenLoop) else None
        slots = simpy.Resource(self.env, capacity=cap) if cap else None
        for t, shape in arrivals:
            if (self.limit is not None and self.arrived >= self.limit) or (
                    self.duration is not None and t >= self.duration):
                return
            yield self.env.timeout(t - self.env.now)
            self.arrived += 1
            if slots is None:
                self.submit(shape)
            else:
                self.env.process(self.client(slots, shape))

    def user(self, shapes):
        while self.limit is None or len(self.requests) < self.limit:
            r = self.submit(next(shapes))
            r.done = self.env.event()
            yield r.done

    def client(self, slots: simpy.Resource, shape: Shape):
        """A bench client under --max-concurrency: the request is sent (and its latencies start) once a slot is
        free, and holds it until it completes."""
        with slots.request() as turn:
            yield turn
            r = self.submit(shape)
            r.done = self.env.event()
            yield r.done

    def run(self) -> float:
        if isinstance(self.load, ClosedLoop):
            shapes = self.load.shapes(self.load_rng)
            for _ in range(self.load.concurrency):
                self.env.process(self.user(shapes))
        else:
            self.env.process(self.open_loop(self.load.arrivals(self.load_rng)))
        for inst in dict.fromkeys(self.prefill + self.decode):
            self.env.process(inst.run())
        self.bar = progress_bar(self.limit, "serving", "request", enabled=self.progress)
        try:
            self.env.run(until=self.duration)
        finally:
            self.bar.close()
        self.count()
        return self.env.now


def simulate(deployment: Deployment, load: Load, step_model: StepModel | Mapping[str, StepModel], seed: int = 0, *,
             requests: int | None = None, duration: float | None = None, slo: Slo | None = None,
             progress: bool = False) -> ServingResult:
    """Serve `load` on `deployment` and measure every request.

    step_model: one model for every instance, or {'prefill': ..., 'decode': ...} when the two pools run different
    plans. Stop after `requests` requests have arrived and all finished, or observe the window [0, duration)
    (requests still running then are reported unfinished); a trace with neither replays all its rows.
    """
    if requests is not None and duration is not None:
        raise NpusimError("give a request count or a duration, not both", field="requests")
    if requests is None and duration is None and not isinstance(load, Trace):
        raise NpusimError("give a request count or a duration (only a trace can run to its end)", field="requests")
    if requests is not None and requests < 1:
        raise NpusimError(f"must be at least 1, got {requests}", field="requests")
    if duration is not None and not duration > 0:
        raise NpusimError(f"must be positive, got {duration}", field="duration")
    models = _phase_models(step_model)
    if not deployment.disaggregated and models["prefill"] is not models["decode"]:
        raise NpusimError("a co-located deployment runs both phases on one plan: give one step model",
                          field="step_model")
    sim = _Simulation(deployment, load, models, seed, requests, duration, progress)
    window = sim.run()
    return ServingResult.of(_request_table(sim.requests), pd.DataFrame(sim.steps, columns=list(STEP_COLUMNS)),
                            _gaps(sim.requests), window=window, slo=slo, emissions=_emissions(sim.requests),
                            mean_waiting=sim.waiting_area / window, mean_in_system=sim.in_system_area / window)


def _request_table(requests: list[Request]) -> pd.DataFrame:
    nan = float("nan")
    return pd.DataFrame(
        [(r.id, r.arrival, r.input, r.output, r.prefix_hit, r.generated, r.preemptions, r.prefill_rank, r.decode_rank,
          nan if r.scheduled is None else r.scheduled, r.times[0] if r.times else nan,
          nan if r.finish is None else r.finish, r.admitted, r.prefill_end, r.kv_ready) for r in requests],
        columns=list(REQUEST_COLUMNS))


def _gaps(requests: list[Request]) -> np.ndarray:
    """Every inter-token latency: the gaps between successive emissions of each request."""
    gaps = [np.diff(r.times) for r in requests if len(r.times) > 1]
    return np.concatenate(gaps) if gaps else np.empty(0)


def _emissions(requests: list[Request]) -> np.ndarray:
    """(time, tokens) of every emission of every request, in time order."""
    rows = [(t, n) for r in requests for t, n in zip(r.times, r.tokens)]
    return np.array(sorted(rows), dtype=float).reshape(-1, 2)


def _phase_models(step_model) -> dict[str, StepModel]:
    if isinstance(step_model, Mapping):
        unknown = set(step_model) - {"prefill", "decode"}
        if unknown:
            name = sorted(unknown)[0]
            raise NpusimError(f"unknown phase '{name}'{did_you_mean(name, ['prefill', 'decode'])}", field="step_model")
        if set(step_model) != {"prefill", "decode"}:
            raise NpusimError("give a step model for both 'prefill' and 'decode'", field="step_model")
        return dict(step_model)
    return {"prefill": step_model, "decode": step_model}
