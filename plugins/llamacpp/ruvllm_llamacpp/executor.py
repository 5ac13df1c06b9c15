"""The llama.cpp :class:`~ruvllm.executor.BatchExecutor`: many sequences, one ``llama_decode``.

One llama.cpp context with ``n_seq_max`` sequences is created over the backend's already
loaded model. Each engine step becomes ONE ``llama_batch`` holding the new tokens of every
scheduled sequence (prefill chunks and single decode tokens mixed), each token tagged with its
sequence id and position; logits are requested only for the last token of an entry that needs
sampling, so llama.cpp computes the output projection only there.

KV layout is ``per_sequence``: llama.cpp keeps KV per sequence id, and with ``kv_unified =
false`` every sequence gets its own stream of ``n_ctx_seq`` cells. That is also why it stays
false: with the unified KV buffer, greedy output of a sequence diverged from the single-stream
output at batch >= 4 on this build (DESIGN-NOTES), while split streams matched for every token.
The engine's block tables are still used for capacity accounting.

How many cells each stream has comes from the ``kv_budget_mib`` option (ruvllm_llamacpp.kv_budget):
split streams are allocated whole at start-up, so their size is a memory decision, logged here.

Every call must come from the engine's model thread (llama.cpp's OpenMP pool is bound to it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from ruvllm.errors import BackendError, InvalidRequest
from ruvllm.executor import BatchEntry

from ruvllm_llamacpp.batch_context import BatchContext
from ruvllm_llamacpp.kv_budget import KvPlan, plan_kv

log = logging.getLogger(__name__)

_DECODE_ERRORS = {1: "no free KV slot", 2: "aborted", -1: "invalid batch"}

#: Largest run of absent sequence ids between two scheduled ones that is bridged with filler
#: tokens (see ``execute``). A step costs roughly a fixed part per graph evaluation plus a part
#: per sequence; DESIGN-NOTES' direct figures (7.6 ms at 1 sequence, 21.6 at 4, 60 at 16, 109
#: at 32, 2 threads) put the fixed part at 5-9 ms and a sequence at ~3 ms, so bridging a hole
#: of one or two sequences is cheaper than the extra graph evaluation it would cause.
MAX_FILL_GAP = 2


class LlamaCppExecutor:
    kv_layout = "per_sequence"
    #: Honours ``BatchEntry.all_logits`` (prompt logprobs).
    prompt_logits = True

    def __init__(self, llama_cpp: ModuleType, model: Any, *, owner: Any = None, kv: KvPlan,
                 block_size: int, max_batch_tokens: int, n_threads: int, n_vocab: int,
                 flash_attn: bool = False):
        max_sequences, n_ctx_seq = kv.sequences, kv.tokens
        if block_size < 1 or n_ctx_seq < block_size:
            raise InvalidRequest("block_size", f"must be in [1, {n_ctx_seq}], got {block_size}", block_size)
        self._lib = llama_cpp
        # The backend that owns the model: kept referenced so the model outlives this context.
        self._owner = owner
        #: The KV memory this executor holds (its describe() is the start-up line).
        self.kv = kv
        self.block_size = block_size
        self.max_sequences = max_sequences
        #: Whole blocks only, so the engine never plans a position past a stream's last cell.
        self.max_seq_len = (n_ctx_seq // block_size) * block_size
        self.num_blocks = max_sequences * (n_ctx_seq // block_size)
        self.max_batch_tokens = max_batch_tokens
        self.n_vocab = n_vocab

        self._context = BatchContext(
            llama_cpp, model, n_ctx=n_ctx_seq * max_sequences, n_batch=max_batch_tokens,
            n_seq_max=max_sequences, kv_unified=False, n_threads=n_threads, flash_attn=flash_attn,
            failure=(f"llama.cpp could not create a context of {max_sequences} sequences x {n_ctx_seq} "
                     "tokens; lower [engine] max_num_seqs or [backends.llamacpp] kv_budget_mib"))
        c = self._context
        self._ctx, self._mem, self._batch = c.ctx, c.mem, c.batch
        self._tok, self._pos, self._want, self._seq_ptrs = c.tokens, c.positions, c.wants_output, c.seq_ptrs
        self._cur_seq = [-1] * max_batch_tokens

    # ------------------------------------------------------------------ the step

    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        self._check_open()
        n = 0
        tok, pos, want, seq_ptrs, cur = self._tok, self._pos, self._want, self._seq_ptrs, self._cur_seq
        total = sum(len(e.tokens) for e in batch)
        if total == 0 or total > self.max_batch_tokens:
            raise BackendError(f"a step holds {total} tokens; the executor takes 1..{self.max_batch_tokens}")
        # With split KV streams llama.cpp cuts a batch into micro-batches of sequences whose ids
        # are consecutive *in batch order* (llama_batch_allocr::split_equal, sequential), and
        # each micro-batch is a whole graph evaluation. The engine's order is admission order
        # and its slot ids get shuffled as requests come and go, which measured 3-15 graph
        # evaluations per decode step instead of 1. Entries therefore go in ascending sequence
        # id order; the logits rows are put back into the caller's order below.
        order = sorted(range(len(batch)), key=lambda i: batch[i].seq_id)
        # A hole in the ids (a prefix donor or an idle sequence between running ones) would
        # still cut the step in two; a small hole is bridged with one throw-away token per
        # absent sequence, written after that sequence's last position and removed again
        # right after the pass (no logits; split streams keep it invisible to every other
        # sequence, and the absent sequence's own KV is untouched).
        fillers: list[tuple[int, int]] = []
        room = self.max_batch_tokens - total
        prev = None
        for i in order:
            s = batch[i].seq_id
            if prev is not None and 1 < s - prev <= MAX_FILL_GAP + 1 and s - prev - 1 <= room:
                for g in range(prev + 1, s):
                    p = int(self._lib.llama_memory_seq_pos_max(self._mem, g)) + 1
                    if p >= self.max_seq_len:
                        fillers = [f for f in fillers if f[0] < prev]
                        break
                    fillers.append((g, p))
                room = self.max_batch_tokens - total - len(fillers)
            prev = s
        fill_at = {g: p for g, p in fillers}
        # For each output row (in sorted order): (caller-order entry index, token index in it).
        rows: list[tuple[int, int]] = []
        prev = None
        for i in order:
            e = batch[i]
            k = len(e.tokens)
            if not 0 <= e.seq_id < self.max_sequences:
                raise BackendError(f"sequence id {e.seq_id} is outside [0, {self.max_sequences})")
            if e.start_pos + k > self.max_seq_len:
                raise BackendError(f"sequence {e.seq_id} would exceed its {self.max_seq_len} KV cells")
            if prev is not None:
                for g in range(prev + 1, e.seq_id):
                    if g in fill_at:
                        tok[n] = 0
                        pos[n] = fill_at[g]
                        want[n] = 0
                        if cur[n] != g:
                            seq_ptrs[n][0] = g
                            cur[n] = g
                        n += 1
            prev = e.seq_id
            if k == 1:
                tok[n] = e.tokens[0]
                pos[n] = e.start_pos
            else:
                tok[n:n + k] = e.tokens
                pos[n:n + k] = np.arange(e.start_pos, e.start_pos + k, dtype=pos.dtype)
            want[n:n + k] = 0
            for j in range(n, n + k):
                if cur[j] != e.seq_id:  # the pointer writes are the slow part: skip unchanged ones
                    seq_ptrs[j][0] = e.seq_id
                    cur[j] = e.seq_id
            n += k
            if e.all_logits:  # prompt logprobs: a row for every token of the entry
                want[n - k:n] = 1
                rows.extend((i, j) for j in range(k))
            elif e.sample:
                want[n - 1] = 1
                rows.append((i, 0))
        self._batch.n_tokens = n
        rc = self._lib.llama_decode(self._ctx, self._batch)
        for g, p in fillers:  # forget the throw-away tokens (also after a failed pass)
            self._lib.llama_memory_seq_rm(self._mem, g, p, -1)
        if rc != 0:
            raise BackendError(
                f"llama_decode failed with code {rc} ({_DECODE_ERRORS.get(rc, 'fatal')}) on a step "
                f"of {n} tokens over {len(batch)} sequences"
            )
        n_out = len(rows)
        if n_out == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        # Output rows come back in (sorted) batch order for exactly the tokens that asked for
        # logits; the caller wants them in its own entry order.
        logits = np.ctypeslib.as_array(self._lib.llama_get_logits(self._ctx), shape=(n_out, self.n_vocab))
        if rows == sorted(rows):
            return logits.copy()
        # rows[r] is the caller position of logits row r: row j of the answer is the j-th smallest.
        return logits[sorted(range(n_out), key=rows.__getitem__)]

    # ------------------------------------------------------------------ KV management

    def free(self, seq_id: int) -> None:
        self._check_open()
        self._lib.llama_memory_seq_rm(self._mem, seq_id, -1, -1)

    def copy_prefix(self, src_seq_id: int, dst_seq_id: int, num_tokens: int) -> None:
        """Give ``dst`` the first ``num_tokens`` positions of ``src``.

        With split KV streams llama.cpp copies a sequence across streams only whole (the copy
        runs at the next decode), so the whole of ``src`` is copied and the tail past
        ``num_tokens`` removed from ``dst``.
        """
        self._check_open()
        self._lib.llama_memory_seq_rm(self._mem, dst_seq_id, -1, -1)
        self._lib.llama_memory_seq_cp(self._mem, src_seq_id, dst_seq_id, -1, -1)
        if not self._lib.llama_memory_seq_rm(self._mem, dst_seq_id, num_tokens, -1):
            raise BackendError(f"llama.cpp could not trim sequence {dst_seq_id} to {num_tokens} tokens")

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        if pairs:
            raise BackendError("the llama.cpp executor keeps KV per sequence (kv_layout "
                               "'per_sequence'); it has no physical blocks to copy")

    def seq_len(self, seq_id: int) -> int:
        """Positions llama.cpp holds for ``seq_id`` (for tests and diagnostics)."""
        return int(self._lib.llama_memory_seq_pos_max(self._mem, seq_id)) + 1

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Free the context (call before the backend's close(), which frees the model)."""
        self._context.close()

    def _check_open(self) -> None:
        if self._context.closed:
            raise BackendError("the llama.cpp executor is closed")


def create_executor(backend: Any, *, max_sequences: int, block_size: int) -> LlamaCppExecutor:
    """An executor over ``backend``'s loaded model: each sequence gets the cells the backend's
    ``kv_budget_mib`` allows (at most its ``n_ctx``), and a step holds up to ``n_batch`` tokens."""
    kv = plan_kv(n_ctx=backend.n_ctx, sequences=max_sequences, bytes_per_token=backend.kv_bytes_per_token,
                 budget_mib=backend.options.kv_budget_mib)
    executor = LlamaCppExecutor(
        backend.llama_cpp, backend.model_handle, owner=backend, kv=kv, block_size=block_size,
        max_batch_tokens=backend.n_batch, n_threads=backend.options.n_threads,
        n_vocab=backend.tokenizer.vocab_size, flash_attn=backend.options.flash_attn,
    )
    # Fewer sequences or a budget exceeded is a capacity the user did not ask for: say so loudly.
    log.log(logging.WARNING if kv.over_budget or kv.sequences < max_sequences else logging.INFO,
            "llamacpp executor: %s", kv.describe())
    return executor
