"""Draft-model speculation: a second model of the same vocabulary proposes each request's drafts.

vLLM's ``draft_model`` method, llama-server's ``--model-draft``. The draft model is loaded
through the backend registry (on the target's backend unless ``speculative_draft_backend``
names another) and runs as a second :class:`~ruvllm.executor.BatchExecutor` on the model
thread. It keeps its own KV accounting (a :class:`BlockManager` and sequence ids of its own),
so the target's capacity, prefix cache and preemption never see it.

Each step, for the decoding requests the policy lets draft (:class:`DraftModelSpeculator`: the
acceptance-and-cost rule of prompt lookup, with the draft model's own step added to a drafted
token's cost):

1. **catch up**: a request's draft sequence is cut back to the longest prefix it shares with
   the request's history (the rejected drafts go: blocks returned, llama.cpp cells trimmed),
   and what the request accepted since, at least its last token, runs through the draft model,
   every request in one forward pass (chunked at the draft executor's batch limit);
2. **draft**: the argmax of each request's last row is its first draft; ``k - 1`` one-token
   passes, batched over the requests still drafting, give the rest.

Proposals are greedy, so deterministic: the unchanged verification rule
(:meth:`ruvllm.engine.executor_core.ExecutorCore._verify`) keeps greedy output exact and the
target's sampling distribution. A request that finishes, is cancelled or is preempted frees its
draft sequence. A draft model that fails mid-step is switched off (requests go on without
drafts) rather than failing the target's requests.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ruvllm.backend import LlmBackend
from ruvllm.engine.block_manager import BlockManager
from ruvllm.engine.request import SchedRequest
from ruvllm.engine.speculative import Speculator
from ruvllm.engine.step_cost import StepCostModel
from ruvllm.errors import DraftVocabularyMismatch, EngineOptionError
from ruvllm.executor import BatchEntry, BatchExecutor

log = logging.getLogger(__name__)


def vocabulary_difference(target: LlmBackend, draft: LlmBackend) -> str | None:
    """What differs between the two models' vocabularies (None: the same ids mean the same
    tokens): their sizes, or the first id whose token text differs.

    BOS/EOS ids are not compared: the draft is fed the target's token ids, never a text of its
    own to tokenize, and backends report them by different conventions for one file (llama.cpp
    lists every end-of-generation token as EOS), which would refuse a model as its own draft."""
    t, d = target.tokenizer, draft.tokenizer
    if t is d:
        return None
    if t.vocab_size != d.vocab_size:
        return f"the target has {t.vocab_size} tokens and the draft {d.vocab_size}"
    for i in range(t.vocab_size):
        a, b = t.token_text(i), d.token_text(i)
        if a != b:
            return f"token {i} is {a!r} in the target and {b!r} in the draft"
    return None


def load_draft_backend(target: LlmBackend, model: str, backend: str | None = None, *, config: Any = None,
                       registry: Any = None) -> tuple[LlmBackend, bool]:
    """The draft ``model`` (``speculative_model``) on ``backend`` (``speculative_draft_backend``,
    default: the target's backend; its ``[backends.<name>]`` options), and whether the caller
    owns it. The target's own model on the target's backend is not loaded twice: the draft
    executor runs over the weights already loaded."""
    from ruvllm.config import load_config, merged_options
    from ruvllm.plugins import get_registry
    from ruvllm.registry import resolve

    config = config or load_config()
    registry = registry or get_registry()
    name = backend or target.name
    cls = registry.get(name)
    source = resolve(model, config.cache_dir)
    if cls is type(target) and target.info.path and Path(target.info.path).resolve() == source.path.resolve():
        return target, False
    return cls.load(source, merged_options(config, name)), True


class DraftModel:
    """The draft model's executor, its KV accounting, and each drafting request's sequence in it."""

    def __init__(self, backend: LlmBackend, executor: BatchExecutor, *, max_sequences: int,
                 vocab_size: int, owns_backend: bool = False):
        """``vocab_size``: the target's; drafts are argmaxes over those ids only."""
        self.backend = backend
        self.executor = executor
        self.owns_backend = owns_backend
        self.blocks = BlockManager(executor.num_blocks, executor.block_size, enable_prefix_caching=False,
                                   watermark=0.0)
        self._free_slots = list(range(min(max_sequences, executor.max_sequences)))[::-1]
        self._seqs: dict[str, _Sequence] = {}
        self._per_sequence = executor.kv_layout == "per_sequence"
        self._vocab = vocab_size
        self.max_seq_len: int | None = getattr(executor, "max_seq_len", None)
        #: Time of the draft's passes by tokens (the catch-up ones of a few tokens and the
        #: one-token ones): what drafting costs besides verification.
        self.cost = StepCostModel()
        #: Catch-up passes with an entry longer than this (a prompt's prefill) are not timed.
        self.timed_tokens = 16

    @classmethod
    def load(cls, target: LlmBackend, model: str | None, backend_name: str | None = None, *,
             max_sequences: int, block_size: int, draft: Any = None, config: Any = None,
             registry: Any = None) -> DraftModel:
        """The draft model for ``target``: ``draft`` (a loaded backend the caller keeps, or a
        zero-argument factory whose backend this object owns), else ``model`` on ``backend_name``
        through the registry (:func:`load_draft_backend`). Refuses a draft whose vocabulary
        differs from the target's (:class:`~ruvllm.errors.DraftVocabularyMismatch`) or that has
        no executor."""
        if draft is None:
            if not model:
                raise EngineOptionError("speculative_model", "names no draft model", model)
            backend, owned = load_draft_backend(target, model, backend_name, config=config, registry=registry)
        elif isinstance(draft, LlmBackend):
            backend, owned = draft, False
        else:
            backend, owned = draft(), True
        try:
            difference = vocabulary_difference(target, backend)
            if difference is not None:
                raise DraftVocabularyMismatch(_describe(target), _describe(backend), difference)
            if not backend.capabilities().executor:
                raise EngineOptionError("speculative_draft_backend", f"backend {backend.name!r} has no "
                                        "iteration-level executor to run a draft model on; pick one whose "
                                        "capabilities list executor (see `ruvllm backends`)", backend.name)
            executor = backend.create_executor(max_sequences=max_sequences, block_size=block_size)
        except BaseException:
            if owned:
                backend.close()
            raise
        log.info("draft model %s on %s for speculative decoding", backend.info.name, backend.name)
        return cls(backend, executor, max_sequences=max_sequences, vocab_size=target.tokenizer.vocab_size,
                   owns_backend=owned)

    # ------------------------------------------------------------------ proposing

    def propose(self, wants: Sequence[tuple[SchedRequest, int]]) -> dict[str, tuple[int, ...]]:
        """Up to ``k`` greedy draft tokens after each request's history, for each ``(request, k)``
        (fewer, or none, where the draft's KV or context runs out)."""
        plan: dict[str, tuple[_Sequence, int]] = {}
        for req, k in wants:
            placed = self._sync(req, k)
            if placed is not None:
                plan[req.request_id] = placed
        drafts: dict[str, list[int]] = {rid: [] for rid in plan}
        # Catch up: the accepted tokens since the last proposal, sampling after the last one.
        rest = {rid: list(seq.history[len(seq.tokens):]) for rid, (seq, _) in plan.items()}
        while rest:
            budget = self.executor.max_batch_tokens
            batch: list[tuple[str, BatchEntry]] = []
            for rid, tokens in rest.items():
                if budget == 0:
                    break
                n = min(len(tokens), budget)
                batch.append((rid, self._entry(plan[rid][0], tokens[:n], sample=n == len(tokens))))
                budget -= n
            rows = self._run([e for _, e in batch])
            r = 0
            for rid, entry in batch:
                plan[rid][0].tokens.extend(entry.tokens)
                del rest[rid][:len(entry.tokens)]
                if entry.sample:
                    drafts[rid].append(self._argmax(rows[r]))
                    r += 1
                    del rest[rid]
        # Draft: one token per pass for every request that wants more.
        while True:
            more = [(rid, seq) for rid, (seq, k) in plan.items() if len(drafts[rid]) < k]
            if not more:
                break
            entries = [self._entry(seq, [drafts[rid][-1]], sample=True) for rid, seq in more]
            rows = self._run(entries)
            for (rid, seq), entry, row in zip(more, entries, rows, strict=True):
                seq.tokens.append(entry.tokens[0])
                drafts[rid].append(self._argmax(row))
        return {rid: tuple(d) for rid, d in drafts.items()}

    def _sync(self, req: SchedRequest, k: int) -> tuple[_Sequence, int] | None:
        """``req``'s draft sequence cut back to what it shares with the request's history and
        grown to hold this proposal, and the tokens it may draft; None when it cannot draft."""
        history = req.token_ids
        if self.max_seq_len is not None:
            k = min(k, self.max_seq_len - len(history) + 1)
        seq = self._seqs.get(req.request_id)
        if k < 1:
            if seq is not None:
                self.release(req.request_id)
            return None
        if seq is None:
            if not self._free_slots:
                return None
            seq = self._seqs[req.request_id] = _Sequence(self._free_slots.pop())
        n = seq.confirmed
        shared = min(len(seq.tokens), len(history) - 1)  # the last token is always run: its row drafts
        while n < shared and seq.tokens[n] == history[n]:
            n += 1
        if n < len(seq.tokens):
            del seq.tokens[n:]
            if self.blocks.has_seq(seq.slot):
                self.blocks.truncate(seq.slot, n)
            if self._per_sequence:
                self.executor.trim(seq.slot, n)
        seq.confirmed = n
        need = len(history) + k - 1  # positions held once the k-1 drafts before the last are run
        if self.blocks.has_seq(seq.slot):
            grown = self.blocks.extend(seq.slot, need)
        else:
            grown = self.blocks.allocate(seq.slot, need)
        if grown is None:  # the draft's KV is full: this request drafts nothing, and lets go
            self.release(req.request_id)
            return None
        seq.history = history
        return seq, k

    def _entry(self, seq: _Sequence, tokens: Sequence[int], *, sample: bool) -> BatchEntry:
        """The pass's entry running ``tokens`` after what ``seq`` holds; its block table covers
        those positions only (the blocks for the rest of the proposal are already taken)."""
        end = len(seq.tokens) + len(tokens)
        table = self.blocks.block_table(seq.slot)[:self.blocks.blocks_needed(end)]
        return BatchEntry(seq_id=seq.slot, tokens=tuple(tokens), start_pos=len(seq.tokens),
                          block_table=table, sample=sample)

    def _run(self, entries: list[BatchEntry]) -> np.ndarray:
        started = time.perf_counter()
        rows = self.executor.execute(entries)
        if max(len(e.tokens) for e in entries) <= self.timed_tokens:
            self.cost.observe(sum(len(e.tokens) for e in entries), time.perf_counter() - started)
        return rows

    def _argmax(self, row: np.ndarray) -> int:
        return int(np.argmax(row[:self._vocab]))

    def relative_cost(self, target: StepCostModel, batch_size: int) -> float | None:
        """A draft pass's time over a target step's, at ``batch_size`` tokens: what one drafted
        token costs in draft-model work, in units of the target's time per token (None until
        both have been timed)."""
        draft, full = self.cost.seconds(batch_size), target.seconds(batch_size)
        return draft / full if draft is not None and full else None

    # ------------------------------------------------------------------ lifetime

    def release(self, request_id: str) -> None:
        """Free ``request_id``'s draft sequence (its blocks and the executor's KV)."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return
        self.blocks.free(seq.slot)
        self.executor.free(seq.slot)
        self._free_slots.append(seq.slot)

    def release_all(self) -> None:
        for request_id in list(self._seqs):
            self.release(request_id)

    @property
    def num_sequences(self) -> int:
        return len(self._seqs)

    def close(self) -> None:
        self.release_all()
        close = getattr(self.executor, "close", None)
        if close is not None:
            close()
        if self.owns_backend:
            self.backend.close()


@attrs.define(eq=False)
class _Sequence:
    slot: int
    #: Tokens whose KV the draft holds, by position (the request's, then drafts).
    tokens: list[int] = attrs.field(factory=list)
    #: Leading ``tokens`` known to be the request's own (not drafts awaiting verification).
    confirmed: int = 0
    #: The request's history at the current proposal.
    history: Sequence[int] = ()


def _describe(backend: LlmBackend) -> str:
    info = backend.info
    return f"{info.name} on {backend.name}" + (f" ({info.path})" if info.path else "")


class DraftModelSpeculator(Speculator):
    """Draft-model proposals for the scheduler, sized by :class:`Speculator`'s policy.

    A drafted token costs its verification (the target's learnt step cost) plus its share of a
    draft-model pass (:meth:`DraftModel.relative_cost`): a draft model as large as the target
    never pays, and the adaptive policy then stops drafting, probes included (they would cost a
    catch-up pass each for nothing). Until the draft's passes have been timed only verification
    is counted, so the cost gets measured.
    """

    #: Drafts of a model of the same family are kept more often than an n-gram's (reported
    #: acceptance 0.6-0.8); each request's own figure replaces this after a few drafts.
    prior_acceptance = 0.7

    def __init__(self, draft: DraftModel, *, num_speculative_tokens: int, disable_by_batch_size: int,
                 adaptive: bool = True):
        super().__init__(num_speculative_tokens=num_speculative_tokens, prompt_lookup_min=1,
                         prompt_lookup_max=1, disable_by_batch_size=disable_by_batch_size, adaptive=adaptive)
        self.draft = draft
        self._ready: dict[str, tuple[int, ...]] = {}
        self._failed = False

    def prepare(self, requests: Sequence[SchedRequest], batch_size: int) -> None:
        self._ready = {}
        if self._failed or batch_size > self.disable_by_batch_size:
            return
        cost = self.cost.token_cost(batch_size) + (self.draft.relative_cost(self.cost, batch_size) or 0.0)
        if self.adaptive and cost >= 1.0:
            return  # a drafted token costs more than a token decoded: no acceptance pays, so no probes
        wants = []
        for req in requests:
            limit = min(self.max_length, req.max_tokens - req.num_output - 1)
            if limit < 1 or req.prediction:  # a predicted output drafts for its request
                continue
            state = self._state(req.request_id, lookup=False)
            k = self._sized(state, cost) if self.adaptive else self.max_length
            if k:
                wants.append((req, min(k, limit)))
        if not wants:
            return
        try:
            self._ready = self.draft.propose(wants)
        except Exception:
            log.exception("the draft model failed; speculative decoding is off for this engine")
            self._failed = True
            self._ready = {}
            self.draft.release_all()

    def propose(self, req: SchedRequest, limit: int, batch_size: int) -> tuple[int, ...]:
        if req.prediction:
            return super().propose(req, limit, batch_size)
        return self._ready.pop(req.request_id, ())[:max(limit, 0)]

    def preempted(self, request_id: str) -> None:
        self._ready.pop(request_id, None)
        self.draft.release(request_id)

    def forget(self, request_id: str) -> None:
        super().forget(request_id)
        self._ready.pop(request_id, None)
        self.draft.release(request_id)

    def close(self) -> None:
        self.draft.close()
