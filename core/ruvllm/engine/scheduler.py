"""Which tokens of which requests run in the next forward pass.

The shape is vLLM v1's: there is no separate "prefill phase" and "decode phase". Every request
has ``token_ids`` and ``num_computed``; each step the scheduler hands out a token budget, first
to running requests (a decode needs 1 token, an unfinished prompt the next chunk of it), then to
waiting requests in policy order. A long prompt is therefore prefilled in chunks across steps
while other requests keep decoding (chunked prefill), and a step never exceeds the budget.

When KV blocks run out, a running request is preempted by recompute: its blocks are freed and
it goes back to the waiting queue keeping its output, to be prefilled again later.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import attrs

from ruvllm.engine.block_manager import NO_HIT, BlockManager
from ruvllm.engine.request import RequestState, SchedRequest
from ruvllm.engine.slots import SlotPool
from ruvllm.errors import InvalidRequest


class Policy(str, enum.Enum):
    FCFS = "fcfs"
    PRIORITY = "priority"
    #: Shortest job first: smallest prompt + max_tokens first.
    SJF = "sjf"


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    #: Most tokens one step may hold (prefill chunks plus decode tokens).
    max_batch_tokens: int = 512
    #: Most requests holding KV (running) at once.
    max_num_seqs: int = 16
    policy: Policy = attrs.field(default=Policy.FCFS, converter=Policy)
    #: Seconds of waiting worth one priority level (priority policy) or a halving of the
    #: estimated job size (SJF): what guarantees a low-priority or long request is served.
    aging_interval: float = 5.0
    #: Largest prefill chunk of one request per step (0 = the whole budget). Smaller chunks
    #: keep running requests' inter-token latency low while a long prompt is prefilled.
    max_prefill_chunk: int = 0
    #: End every prefill with a chunk of its own from the last whole block on: the rows a later
    #: prefix-cache hit on the same tokens recomputes (BlockManager.lookup_prefix), so they are
    #: computed by the same few-row step both times (the executor's ``split_prompt_tail``).
    split_prompt_tail: bool = False
    #: With ``split_prompt_tail``: the fewest rows of a step that the executor computes with its
    #: other kernel (llama.cpp's tiled flash attention: 64). A prompt whose rest is prefilled in
    #: one step of fewer rows, with nothing else in that step, already computes every row as a
    #: repeat's smaller step does: it is not split, and its first token comes a step sooner.
    #: 0: always split.
    split_prompt_tail_rows: int = 0

    def __attrs_post_init__(self) -> None:
        for name in ("max_batch_tokens", "max_num_seqs"):
            value = getattr(self, name)
            if value < 1:
                raise InvalidRequest(name, f"must be >= 1, got {value}", value)
        if self.aging_interval <= 0:
            raise InvalidRequest("aging_interval", "must be > 0 seconds", self.aging_interval)
        if self.max_prefill_chunk < 0:
            raise InvalidRequest("max_prefill_chunk", "must be >= 0 (0 = no cap)", self.max_prefill_chunk)


@attrs.frozen
class ScheduledChunk:
    """Tokens of one request to run this step (maps to one :class:`BatchEntry`)."""

    request: SchedRequest
    start_pos: int
    tokens: tuple[int, ...]
    #: The chunk ends at the last known token: sample the next one from its logits.
    sample: bool
    #: Drafted tokens at the end of ``tokens`` (speculative decoding), verified from the logits
    #: of every position; they are not in ``request.token_ids`` until accepted.
    num_draft: int = 0


@attrs.define
class StepPlan:
    """What one step does (the seed crate's IterationPlan)."""

    chunks: list[ScheduledChunk] = attrs.field(factory=list)
    preempted: list[SchedRequest] = attrs.field(factory=list)
    #: Copy-on-write block copies to run before the forward pass (paged layout).
    copies: list[tuple[int, int]] = attrs.field(factory=list)
    #: ``(donor slot, new slot, tokens)``: cached prefixes to copy before the forward pass
    #: (per-sequence layout).
    prefix_copies: list[tuple[int, int, int]] = attrs.field(factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(len(c.tokens) for c in self.chunks)

    def __bool__(self) -> bool:
        return bool(self.chunks)


class Drafter(Protocol):
    """Proposes tokens to verify after a decoding request's last one (speculative decoding)."""

    def prepare(self, requests: Sequence[SchedRequest], batch_size: int) -> None:
        """Before a step's proposals: the running requests that decode (a draft model drafts
        for all of them at once)."""
        ...

    def propose(self, req: SchedRequest, limit: int, batch_size: int) -> tuple[int, ...]: ...

    def preempted(self, request_id: str) -> None:
        """``request_id`` was preempted: drop whatever KV its drafts held."""
        ...


class Scheduler:
    """Owns the waiting and running queues and the block manager's view of each request."""

    def __init__(self, config: SchedulerConfig, blocks: BlockManager, *,
                 clock: Callable[[], float] = time.monotonic, slots: SlotPool | None = None,
                 copy_prefixes: bool = False, drafter: Drafter | None = None):
        """``slots`` hands out executor sequence ids (default: ``max_num_seqs`` plain ones);
        ``copy_prefixes`` says a prefix hit needs its KV copied from a donor sequence;
        ``drafter`` proposes drafts for decoding requests (None: no speculation)."""
        self.config = config
        self.blocks = blocks
        self.clock = clock
        self.slots = slots or SlotPool(config.max_num_seqs)
        self.copy_prefixes = copy_prefixes
        self.drafter = drafter
        self.waiting: list[SchedRequest] = []
        self.running: list[SchedRequest] = []
        self._next_seq_no = 0
        # Counters for metrics.
        self.num_preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0

    # ---------------------------------------------------------------- queue operations

    def add(self, req: SchedRequest) -> None:
        req.seq_no = self._next_seq_no
        self._next_seq_no += 1
        req.state = RequestState.WAITING
        self.waiting.append(req)

    def finish(self, req: SchedRequest) -> None:
        """Remove ``req`` wherever it is and return all its blocks (completion, cancel, error)."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release(req)
        req.state = RequestState.FINISHED

    def take_released_slots(self) -> list[tuple[int, int]]:
        """``(slot, keep)``: KV the executor must free (keep 0) or trim to ``keep`` positions
        before the next forward pass (see :mod:`.slots`)."""
        return self.slots.take_released()

    def end_step(self) -> None:
        """After the forward pass: retire redundant and surplus prefix donors (see :mod:`.slots`)."""
        self.slots.end_step()

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---------------------------------------------------------------- the step

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        budget = self.config.max_batch_tokens
        scheduled: set[int] = set()
        if self.drafter is not None:
            self.drafter.prepare([r for r in self.running if r.num_pending == 1], len(self.running))
        for req in list(self.running):
            if budget == 0:
                break
            if req.state is not RequestState.RUNNING:
                continue  # preempted earlier in this loop
            n = self._chunk_len(req, budget)
            if n == 0:
                continue
            drafts = self._drafts(req, n, budget)
            while True:
                pairs = self.blocks.extend(req.slot, req.num_computed + n + len(drafts))  # type: ignore[arg-type]
                if pairs is not None:
                    break
                if drafts:  # no blocks to speculate with: decode plainly
                    drafts = ()
                    continue
                victim = self._pick_victim(req, scheduled)
                self._preempt(victim)
                plan.preempted.append(victim)
                if victim is req:
                    break
            if req.state is not RequestState.RUNNING:
                continue
            plan.copies.extend(pairs)
            self._add_chunk(plan, req, n, drafts)
            scheduled.add(id(req))
            budget -= n + len(drafts)
        if not plan.preempted:
            budget = self._admit(plan, budget)
        return plan

    def _admit(self, plan: StepPlan, budget: int) -> int:
        now = self.clock()
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = min(self.waiting, key=lambda r: self._waiting_key(r, now))
            hit, donor = NO_HIT, None
            if req.num_computed == 0 and req.reuse_prefix:
                hit = self.blocks.lookup_prefix(req.token_ids, req.cache_salt)
                if self.copy_prefixes:
                    donor, hit = self.slots.donor_for(hit, req.token_ids, req.cache_salt)
            # Alone: no request runs and none other waits, so this chunk is the step's only one.
            n = self._tail_split(req, hit.num_tokens, min(len(req.token_ids) - hit.num_tokens, budget),
                                 alone=not self.running and len(self.waiting) == 1)
            if self.config.max_prefill_chunk:
                n = min(n, self.config.max_prefill_chunk)
            if not self.blocks.can_admit(hit.num_tokens + n, hit):
                break  # the head waits for blocks; skipping it could starve large requests
            slot = self.slots.acquire()
            if slot is None:
                break  # every slot is running or a donor still being retired
            pairs = self.blocks.allocate(slot, hit.num_tokens + n, hit)
            assert pairs is not None
            if donor is not None:
                plan.prefix_copies.append((donor, slot, hit.num_tokens))
            self.waiting.remove(req)
            req.slot = slot
            req.state = RequestState.RUNNING
            req.num_computed = hit.num_tokens
            self.prefix_queries += len(req.token_ids)
            self.prefix_hits += hit.num_tokens
            if req.first_scheduled is None:
                # The user's cached tokens are what the first admission found (as vLLM reports
                # them): a preempted request finding its own KV again saved no prompt work.
                req.num_cached_tokens = hit.num_tokens
                req.first_scheduled = now
            self.running.append(req)
            plan.copies.extend(pairs)
            self._add_chunk(plan, req, n)
            budget -= n
        return budget

    def update(self, plan: StepPlan) -> None:
        """Record that ``plan`` ran: its tokens now have KV, and full blocks become cacheable."""
        for chunk in plan.chunks:
            req = chunk.request
            if req.state is not RequestState.RUNNING:
                continue
            req.num_computed = chunk.start_pos + len(chunk.tokens)
            self.blocks.cache_blocks(req.slot, req.token_ids, req.num_computed,  # type: ignore[arg-type]
                                     req.cache_salt)

    def settle_drafts(self, chunk: ScheduledChunk, accepted: int) -> None:
        """After verification: ``accepted`` of ``chunk``'s drafts were kept (and appended to the
        request's tokens). The KV of the rest is invalid: its blocks go back; the caller trims a
        per-sequence executor's KV to ``request.num_computed``."""
        req = chunk.request
        req.num_computed = chunk.start_pos + len(chunk.tokens) - chunk.num_draft + accepted
        self.blocks.truncate(req.slot, req.num_computed)  # type: ignore[arg-type]
        self.blocks.cache_blocks(req.slot, req.token_ids, req.num_computed, req.cache_salt)  # type: ignore[arg-type]

    # ---------------------------------------------------------------- policy

    def _waiting_key(self, req: SchedRequest, now: float) -> tuple[float, int]:
        """Smaller is served first; ``seq_no`` breaks ties so the order is total."""
        policy = self.config.policy
        waited = max(now - req.arrival, 0.0) / self.config.aging_interval
        if policy is Policy.PRIORITY:
            return (-(req.priority + waited), req.seq_no)
        if policy is Policy.SJF:
            return ((req.num_prompt + req.max_tokens) / (2.0 ** waited), req.seq_no)
        return (0.0, req.seq_no)

    def _pick_victim(self, req: SchedRequest, scheduled: set[int]) -> SchedRequest:
        """The running request to preempt: never one already scheduled this step (its chunk is
        in the plan); among the rest the least important, else the latest admitted."""
        candidates = [r for r in self.running if id(r) not in scheduled]
        if self.config.policy is Policy.PRIORITY:
            return min(candidates, key=lambda r: (r.priority, -r.seq_no))
        return candidates[-1]

    # ---------------------------------------------------------------- helpers

    def _chunk_len(self, req: SchedRequest, budget: int) -> int:
        n = self._tail_split(req, req.num_computed, min(req.num_pending, budget))
        if self.config.max_prefill_chunk and req.num_pending > 1:
            n = min(n, self.config.max_prefill_chunk)
        return n

    def _tail_split(self, req: SchedRequest, start: int, n: int, *, alone: bool = False) -> int:
        """``n``, or fewer so that a chunk from ``start`` stops where a prefix-cache hit on
        ``req``'s tokens would resume (``split_prompt_tail``); not when the chunk is ``alone``
        in its step, ends the prompt and is under ``split_prompt_tail_rows``."""
        if not self.config.split_prompt_tail:
            return n
        if alone and start + n == len(req.token_ids) and n < self.config.split_prompt_tail_rows:
            return n
        bs = self.blocks.block_size
        tail = (len(req.token_ids) - 1) // bs * bs
        return tail - start if start < tail < start + n else n

    def _drafts(self, req: SchedRequest, n: int, budget: int) -> tuple[int, ...]:
        """Drafts for a decode step of ``req``, within the budget and the request's max_tokens
        (a step emits at most drafts + 1 tokens)."""
        if self.drafter is None or n != 1 or req.num_pending != 1:
            return ()
        limit = min(budget - 1, req.max_tokens - req.num_output - 1)
        return self.drafter.propose(req, limit, len(self.running))

    def _add_chunk(self, plan: StepPlan, req: SchedRequest, n: int, drafts: tuple[int, ...] = ()) -> None:
        start = req.num_computed
        end = start + n
        tokens = tuple(req.token_ids[start:end])
        plan.chunks.append(ScheduledChunk(req, start, tokens + drafts, end == len(req.token_ids),
                                          num_draft=len(drafts)))

    def _preempt(self, req: SchedRequest) -> None:
        self.running.remove(req)
        self._release(req, resumes=True)
        if self.drafter is not None:
            self.drafter.preempted(req.request_id)
        req.num_computed = 0
        req.num_preemptions += 1
        req.state = RequestState.PREEMPTED
        self.waiting.append(req)
        self.num_preemptions += 1

    def _release(self, req: SchedRequest, *, resumes: bool = False) -> None:
        if req.slot is not None:
            table = self.blocks.block_table(req.slot) if self.blocks.has_seq(req.slot) else ()
            self.blocks.free(req.slot)
            self.slots.release(req.slot, table, req.num_computed, req.token_ids, req.cache_salt,
                               resumes=resumes)
            req.slot = None
