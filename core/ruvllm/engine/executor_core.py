"""The executor path: schedule -> one forward pass over the mixed batch -> sample -> outputs.

Runs only on the model thread. Each :meth:`ExecutorCore.step` is one iteration of continuous
batching: every running request contributes its next token (or prefill chunk) to a single
``BatchExecutor.execute`` call, so the weights are read once for all of them.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from ruvllm.engine.block_manager import BlockManager
from ruvllm.engine.draft_model import DraftModel
from ruvllm.engine.live import LiveRequest
from ruvllm.engine.metrics import EngineMetrics
from ruvllm.engine.options import EngineOptions
from ruvllm.engine.request import RequestState
from ruvllm.engine.scheduler import ScheduledChunk, Scheduler
from ruvllm.engine.slots import DonorSlotPool, ParkedDonorPool, SlotPool
from ruvllm.errors import BackendError, RequestTimedOut
from ruvllm.executor import BatchEntry, BatchExecutor
from ruvllm.guided.batch import start_step_masks
from ruvllm.types import FinishReason

log = logging.getLogger(__name__)


class ExecutorCore:
    path = "executor"

    def __init__(self, executor: BatchExecutor, options: EngineOptions, metrics: EngineMetrics, *,
                 draft: DraftModel | None = None):
        """``draft``: the loaded draft model of ``speculative_method = "draft_model"``."""
        self.executor = executor
        self.metrics = metrics
        prefix = options.enable_prefix_caching
        num_blocks = min(options.num_blocks or executor.num_blocks, executor.num_blocks)
        self.blocks = BlockManager(num_blocks, executor.block_size, enable_prefix_caching=prefix,
                                   watermark=options.watermark)
        max_running = min(options.max_num_seqs, executor.max_sequences)
        config = options.scheduler_config(
            max_num_seqs=max_running,
            max_batch_tokens=min(options.max_batch_tokens, executor.max_batch_tokens),
            split_prompt_tail=getattr(executor, "split_prompt_tail", False),
            split_prompt_tail_rows=getattr(executor, "split_prompt_tail_rows", 0),
        )
        per_sequence = self._per_sequence = executor.kv_layout == "per_sequence"
        #: Verifying drafts needs logits at every position of an entry (``all_logits``); without
        #: speculative_method only predicted outputs draft.
        self.speculator = options.speculator(draft) if getattr(executor, "prompt_logits", False) else None
        if options.speculative_method != "none" and self.speculator is None:
            log.warning("speculative decoding is off: this executor gives no logits per drafted position")
        if prefix and per_sequence:
            # KV lives per sequence id: cached prefixes are kept alive in donor sequences.
            pool = ParkedDonorPool if getattr(executor, "detached_donors", False) else DonorSlotPool
            slots: SlotPool = pool(executor.max_sequences, executor.max_sequences - max_running, self.blocks)
        else:
            slots = SlotPool(max_running)
        self.scheduler = Scheduler(config, self.blocks, slots=slots, copy_prefixes=prefix and per_sequence,
                                   drafter=self.speculator)
        self.live: dict[str, LiveRequest] = {}

    # ----------------------------------------------------------------- limits

    def max_request_tokens(self) -> int:
        """Longest prompt + output one request may have (KV capacity, per-sequence limit)."""
        usable_blocks = self.blocks.num_blocks - self.blocks.watermark_blocks
        cap = usable_blocks * self.blocks.block_size
        per_seq = getattr(self.executor, "max_seq_len", None)
        return min(cap, per_seq) if per_seq else cap

    # ----------------------------------------------------------------- requests

    def add(self, live: LiveRequest) -> None:
        self.live[live.request_id] = live
        self.scheduler.add(live.sched)

    def cancel(self, request_id: str) -> None:
        live = self.live.get(request_id)
        if live is not None:
            self._end(live, FinishReason.CANCELLED)

    def expire(self, now: float) -> None:
        for live in [lv for lv in self.live.values() if lv.deadline is not None and lv.deadline <= now]:
            self._end(live, FinishReason.CANCELLED, RequestTimedOut(live.request_id, live.timeout or 0.0))

    def shutdown(self) -> None:
        for live in list(self.live.values()):
            self._end(live, FinishReason.CANCELLED)
        if self.speculator is not None:
            self.speculator.close()
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_requeued(self) -> int:
        return sum(1 for r in list(self.scheduler.waiting) if r.state is RequestState.PREEMPTED)

    # ----------------------------------------------------------------- the step

    def step(self) -> bool:
        """Run one iteration; False when nothing could be scheduled."""
        plan = self.scheduler.schedule()
        self._free_released()
        if not plan:
            return False
        now = time.perf_counter()
        entries = []
        for chunk in plan.chunks:
            req = chunk.request
            live = self.live[req.request_id]
            live.mark_started(now, self.metrics)
            collector = live.prompt_logprobs
            entries.append(BatchEntry(
                seq_id=req.slot, tokens=chunk.tokens, start_pos=chunk.start_pos,  # type: ignore[arg-type]
                block_table=self.blocks.block_table(req.slot), sample=chunk.sample,  # type: ignore[arg-type]
                adapter=live.params.adapter, invariant=req.invariant,
                all_logits=chunk.num_draft > 0 or (collector is not None
                                                   and collector.wants(chunk.start_pos, len(chunk.tokens))),
            ))
        try:
            if plan.copies:
                self.executor.copy_blocks(plan.copies)
            for src, dst, n in plan.prefix_copies:
                self.executor.copy_prefix(src, dst, n)
            # Grammar masks of the constrained rows are computed while the model runs.
            start_step_masks(self.live[c.request.request_id].sampler for c in plan.chunks if c.sample)
            started = time.perf_counter()
            logits = self.executor.execute(entries)
        except Exception as exc:  # the backend failed: fail this step's requests, keep serving
            log.exception("executor step failed")
            for chunk in plan.chunks:
                chunk.request.num_computed = 0  # what its KV holds is unknown: keep none of it
                live = self.live.get(chunk.request.request_id)
                if live is not None:
                    self._end(live, FinishReason.ERROR, BackendError(f"the model step failed: {exc}"))
            return True
        now = time.perf_counter()
        if self.speculator is not None and all(len(c.tokens) - c.num_draft == 1 for c in plan.chunks):
            self.speculator.cost.observe(plan.num_tokens, now - started)  # what drafted tokens cost
        self.scheduler.update(plan)
        row = 0
        for chunk, entry in zip(plan.chunks, entries, strict=True):
            req = chunk.request
            live = self.live[req.request_id]
            if chunk.num_draft:
                k = len(entry.tokens)
                self._verify(chunk, live, logits[row:row + k], now)
                row += k
                continue
            if entry.all_logits:
                k = len(entry.tokens)
                live.prompt_logprobs.add(entry.start_pos, logits[row:row + k])  # type: ignore[union-attr]
                row += k - 1 if chunk.sample else k  # the last row is also the sampling row
            if not chunk.sample:
                continue
            if live.builder.finished:  # max_tokens 0: the prompt is scored, nothing is sampled
                row += 1
                self._end(live, FinishReason.LENGTH, now=now)
                continue
            self._sample(live, logits[row], now)
            row += 1
            self._after_sampling(live, now)
        self.scheduler.end_step()
        self._free_released()
        return True

    def _sample(self, live: LiveRequest, row: np.ndarray, now: float) -> int:
        """Sample ``live``'s next token from ``row`` and record it; return it."""
        token = live.sampler.sample(row)  # type: ignore[union-attr]
        live.add_token(token, now, self.metrics)
        live.sched.token_ids.append(token.token_id)
        return token.token_id

    def _after_sampling(self, live: LiveRequest, now: float) -> None:
        if live.builder.finished:
            self._end(live, live.builder.finish_reason, now=now)  # type: ignore[arg-type]
        else:
            live.flush()

    def _verify(self, chunk: ScheduledChunk, live: LiveRequest, rows: np.ndarray, now: float) -> None:
        """Sample every position of a drafted chunk in turn, keeping drafts while each is the
        token sampled there; the first other token (or the one after the last draft) ends it.

        Each position is sampled by the request's own sampler, which applies logit_bias,
        processors, the grammar mask and penalties as of the tokens before it, exactly as one
        decode step would. For a draft that is a point mass (prompt lookup), accepting draft
        ``d`` when the sampled token is ``d`` IS the rejection-sampling rule: ``d`` is kept with
        probability ``p(d)``, and a rejection leaves a token drawn from ``p`` without ``d``,
        renormalised. The sampler's random numbers are consumed one per emitted token, as
        without speculation, so a seed gives the same tokens either way (up to the rounding of
        the logits themselves).
        """
        drafts = chunk.tokens[len(chunk.tokens) - chunk.num_draft:]
        accepted = 0
        for i, row in enumerate(rows):
            token = self._sample(live, row, now)
            hit = i < len(drafts) and token == drafts[i]
            accepted += hit
            if live.builder.finished or not hit:
                break
        self.scheduler.settle_drafts(chunk, accepted)
        if self._per_sequence and accepted < len(drafts):
            self.executor.trim(chunk.request.slot, chunk.request.num_computed)  # type: ignore[arg-type]
        assert self.speculator is not None
        self.speculator.record(live.request_id, len(drafts), accepted)
        live.record_drafts(len(drafts), accepted)
        self.metrics.observe_drafts(len(drafts), accepted)
        self._after_sampling(live, now)

    def fail_all(self, error: BaseException) -> None:
        """End every request with ``error`` (an unexpected failure inside a step)."""
        for live in list(self.live.values()):
            self._end(live, FinishReason.ERROR, error)

    def _end(self, live: LiveRequest, reason: FinishReason, error: BaseException | None = None,
             now: float | None = None) -> None:
        self.live.pop(live.request_id, None)
        if self.speculator is not None:
            self.speculator.forget(live.request_id)
        self.scheduler.finish(live.sched)
        self._free_released()
        live.end(reason, self.metrics, error=error, now=now)

    def _free_released(self) -> None:
        retire = getattr(self.executor, "retire", None) or self.executor.trim
        for slot, keep in self.scheduler.take_released_slots():
            if keep:  # the slot is a prefix donor: it keeps its first ``keep`` positions, runs no more
                retire(slot, keep)
            else:
                self.executor.free(slot)

    # ----------------------------------------------------------------- metrics

    def kv_usage(self) -> float:
        return self.blocks.usage

    def kv_capacity_tokens(self) -> int:
        return self.blocks.num_blocks * self.blocks.block_size

    def kv_used_tokens(self) -> int:
        return self.blocks.num_used_blocks * self.blocks.block_size

    def prefix_counters(self) -> tuple[int, int]:
        return self.scheduler.prefix_queries, self.scheduler.prefix_hits

    def prefix_cache_prompts(self) -> int:
        return self.scheduler.slots.num_donors

    def prefix_cache_host_bytes(self) -> int:
        """Bytes a detached-donor executor keeps outside the pool (its optional ``parked_bytes``)."""
        return int(getattr(self.executor, "parked_bytes", 0))

    def preemptions(self) -> int:
        return self.scheduler.num_preemptions
