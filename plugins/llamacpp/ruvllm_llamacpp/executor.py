"""The llama.cpp :class:`~ruvllm.executor.BatchExecutor`: many sequences, one ``llama_decode``.

One llama.cpp context is created over the backend's already loaded model. Each engine step
becomes ONE ``llama_batch`` holding the new tokens of every scheduled sequence (prefill chunks
and single decode tokens mixed), each token tagged with its sequence id and position; logits are
requested only for the last token of an entry that needs sampling, so llama.cpp computes the
output projection only there.

KV is one unified pool (``kv_unified``, as llama-server's default with several slots): every
sequence takes cells from it as it grows, so one request may use the model's whole context
while the pool has room (ruvllm_llamacpp.kv_pool sizes it). The engine's block manager accounts
the same cells in blocks and decides who gets them; the executor keeps llama.cpp's cells equal
to that account: it frees a finished sequence, and shares a running sequence's cached prefix by
adding a sequence id to its cells (``llama_memory_seq_cp`` within one stream copies no data), so
a prefix shared by N requests occupies its cells once, as its blocks are counted once. A prefix
donor (a finished request kept for its cached blocks, :meth:`retire`) leaves the pool for host
memory (ruvllm_llamacpp.parked says why) and comes back as the same bytes into the sequence that
hits it; the engine then never restores one donor beside a running copy of its blocks
(``detached_donors``), so the cells still never exceed its account.

A unified pool is one KV stream, so llama.cpp runs a whole step as one micro-batch whatever the
sequence ids (``split_simple``). Attention's sums group values by cell index (flash attention's
tiled kernel by 64-cell tiles), and without flash attention they read every cell in use up to
the highest one (masked per sequence), so a sequence's logits move slightly with what else
occupies the pool and with the step's size: greedy tokens may flip at near-ties, which the
conformance suite's isolation rule bounds (docs/conformance.md). A request repeated on an idle
pool computes the same logits (``split_prompt_tail``, parked donors). With ``batch_invariant``
every row's logits are its sequence's alone, whatever else runs (ruvllm_llamacpp.cell_order).

Every call must come from the engine's model thread (llama.cpp's OpenMP pool is bound to it).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import attrs
import numpy as np
from ruvllm.errors import BackendError, BatchInvariantUnsupported, InvalidRequest
from ruvllm.executor import BatchEntry

from ruvllm_llamacpp.batch_context import BatchContext
from ruvllm_llamacpp.cell_order import INVARIANT_UBATCH, CellOrder, check_rows, needs_pad
from ruvllm_llamacpp.kv_pool import KV_TYPES, LLAMA_MAX_SEQ, KvPool, plan_pool
from ruvllm_llamacpp.parked import ParkedPrefix, restore_sequence, save_sequence, truncate

log = logging.getLogger(__name__)

_DECODE_ERRORS = {1: "no free KV slot", 2: "aborted", -1: "invalid batch"}
#: Rows of a micro-batch from which llama.cpp's CPU flash attention takes its tiled kernel
#: (``GGML_FA_TILE_Q``, ggml-cpu/common.h); fewer take the per-row one.
FA_TILED_ROWS = 64
#: Cells of the batch-invariant mode's start-up check (its prompts take about a hundred).
CHECK_CELLS = 256


class LlamaCppExecutor:
    kv_layout = "per_sequence"
    #: Honours ``BatchEntry.all_logits`` (prompt logprobs).
    prompt_logits = True

    def __init__(self, llama_cpp: ModuleType, model: Any, *, owner: Any = None, pool: KvPool,
                 max_sequences: int, block_size: int, max_batch_tokens: int, n_threads: int,
                 n_vocab: int, flash_attn: bool = False, park_prefixes: bool = True,
                 batch_invariant: bool = False):
        if block_size < 1 or pool.per_request < block_size:
            raise InvalidRequest("block_size", f"must be in [1, {pool.per_request}], got {block_size}",
                                 block_size)
        # The mode keeps one more sequence id: its padding row's and a restore's staging id.
        most = LLAMA_MAX_SEQ - 1 if batch_invariant else LLAMA_MAX_SEQ
        if not 1 <= max_sequences <= most:
            raise InvalidRequest("max_sequences", f"llama.cpp holds 1..{most} sequences here, got "
                                 f"{max_sequences}; lower [engine] max_num_seqs or prefix_donor_slots",
                                 max_sequences)
        if batch_invariant and not flash_attn:
            raise BatchInvariantUnsupported("llamacpp", "without flash attention llama.cpp sums "
                                            "attention by cell index across the whole pool; set "
                                            "[backends.llamacpp] flash_attn = \"auto\" or true")
        self._lib = llama_cpp
        # The backend that owns the model: kept referenced so the model outlives this context.
        self._owner = owner
        #: The KV pool this executor holds (its describe() is the start-up line).
        self.pool = pool
        self.block_size = block_size
        self.max_sequences = max_sequences
        #: Whole blocks only, so the engine never plans a position past the last usable cell.
        self.max_seq_len = pool.per_request // block_size * block_size
        self.num_blocks = pool.tokens // block_size
        self.n_vocab = n_vocab

        self._context = BatchContext(
            llama_cpp, model, n_ctx=pool.tokens, n_batch=max_batch_tokens,
            n_seq_max=max_sequences + batch_invariant, n_ubatch=INVARIANT_UBATCH if batch_invariant else None,
            kv_unified=True, n_threads=n_threads, flash_attn=flash_attn,
            type_k=KV_TYPES[pool.type_k].ggml_type, type_v=KV_TYPES[pool.type_v].ggml_type,
            failure=(f"llama.cpp could not create a KV pool of {pool.tokens} tokens for {max_sequences} "
                     "sequences; lower [backends.llamacpp] kv_budget_mib or [engine] max_num_seqs"))
        c = self._context
        self._ctx, self._mem, self._batch = c.ctx, c.mem, c.batch
        # llama.cpp caps a context's batch at its cell count (a pool smaller than n_batch) and
        # aborts the process on a larger step: the engine must plan within the cap.
        # The mode keeps a token of room for its padding row.
        self.max_batch_tokens = min(max_batch_tokens, int(llama_cpp.llama_n_batch(c.ctx))) - batch_invariant
        self._tok, self._pos, self._want, self._seq_ptrs = c.tokens, c.positions, c.wants_output, c.seq_ptrs
        self._cur_seq = [-1] * max_batch_tokens
        #: Donors parked in host memory (``park_prefixes``; ruvllm_llamacpp.parked says why).
        self.detached_donors = park_prefixes
        #: Flash attention takes a tiled kernel for a micro-batch of 64 rows or more and a
        #: per-row one below, which round differently: a prompt's last rows, the ones a
        #: prefix-cache hit on it recomputes, get a step of their own (ruvllm.executor).
        self.split_prompt_tail = flash_attn and not batch_invariant
        #: A prompt alone in a step of fewer rows takes the per-row kernel throughout: no split
        #: (at one client a short prompt's first token then costs one llama_decode, not two).
        self.split_prompt_tail_rows = FA_TILED_ROWS
        #: The batch-invariant mode's bookkeeping (None: off); every row then takes the per-row
        #: kernel, so no tail needs a step of its own.
        self.cell_order = (CellOrder(llama_cpp, c.ctx, c.mem, spare=max_sequences)
                           if batch_invariant else None)
        self._parked: dict[int, ParkedPrefix] = {}
        # Kept as a running total: metrics read it from other threads while the model thread
        # parks and drops prefixes.
        self._parked_bytes = 0

    # ------------------------------------------------------------------ the step

    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        self._check_open()
        tok, pos, want, seq_ptrs, cur = self._tok, self._pos, self._want, self._seq_ptrs, self._cur_seq
        total = sum(len(e.tokens) for e in batch)
        if total == 0 or total > self.max_batch_tokens:
            raise BackendError(f"a step holds {total} tokens; the executor takes 1..{self.max_batch_tokens}")
        order = self.cell_order
        if order is not None:
            order.compact()
        n = 0
        n_out = 0
        for e in batch:
            k = len(e.tokens)
            if not 0 <= e.seq_id < self.max_sequences:
                raise BackendError(f"sequence id {e.seq_id} is outside [0, {self.max_sequences})")
            if e.start_pos + k > self.max_seq_len:
                raise BackendError(f"sequence {e.seq_id} would exceed the {self.max_seq_len} tokens "
                                   "one request may use")
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
                n_out += k
            elif e.sample:
                want[n - 1] = 1
                n_out += 1
        padded = order is not None and needs_pad(n)
        if padded:
            tok[n], pos[n], want[n] = tok[0], 0, 0
            if cur[n] != order.spare:
                seq_ptrs[n][0] = cur[n] = order.spare
            n += 1
        self._batch.n_tokens = n
        rc = self._lib.llama_decode(self._ctx, self._batch)
        if padded:  # its cell is the step's highest: freeing it leaves no hole below another's
            self._lib.llama_memory_seq_rm(self._mem, order.spare, -1, -1)
        if order is not None:
            order.placed([e.seq_id for e in batch])
        if rc != 0:
            raise BackendError(
                f"llama_decode failed with code {rc} ({_DECODE_ERRORS.get(rc, 'fatal')}) on a step "
                f"of {n} tokens over {len(batch)} sequences"
            )
        if n_out == 0:
            return np.zeros((0, self.n_vocab), dtype=np.float32)
        # One stream: llama.cpp keeps the batch's order, so the rows are in the entries' order.
        logits = self._lib.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(logits, shape=(n_out, self.n_vocab)).copy()

    # ------------------------------------------------------------------ KV management

    def free(self, seq_id: int) -> None:
        self._check_open()
        self._set_parked(seq_id, None)
        self._lib.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
        if self.cell_order is not None:
            self.cell_order.freed(seq_id)

    def trim(self, seq_id: int, num_tokens: int) -> None:
        """Keep only the first ``num_tokens`` positions of ``seq_id`` (cells no other sequence
        shares become free)."""
        self._check_open()
        parked = self._parked.get(seq_id)
        if parked is not None:
            if num_tokens < parked.num_tokens:
                self._set_parked(seq_id, ParkedPrefix(truncate(parked.data, num_tokens), num_tokens))
            return
        if not self._lib.llama_memory_seq_rm(self._mem, seq_id, num_tokens, -1):
            raise BackendError(f"llama.cpp could not trim sequence {seq_id} to {num_tokens} tokens")
        if self.cell_order is not None:
            self.cell_order.trimmed(seq_id, num_tokens)

    @property
    def parked_bytes(self) -> int:
        """Host memory the parked prefixes take (at most the pool's size: the engine bounds the
        positions they keep, each counted whole, by it); the engine's ``prefix_cache_host_bytes``
        metric."""
        return self._parked_bytes

    def _set_parked(self, seq_id: int, prefix: ParkedPrefix | None) -> None:
        """Park ``prefix`` as ``seq_id``'s (None: drop what it had), keeping the byte total."""
        old = self._parked.pop(seq_id, None)
        if old is not None:
            self._parked_bytes -= len(old.data)
        if prefix is not None:
            self._parked[seq_id] = prefix
            self._parked_bytes += len(prefix.data)

    def retire(self, seq_id: int, num_tokens: int) -> None:
        """``seq_id`` is a prefix donor now: it keeps its first ``num_tokens`` positions for
        :meth:`copy_prefix` and runs no more steps; parked in host memory when
        ``detached_donors``, else trimmed in place."""
        self.trim(seq_id, num_tokens)
        if not self.detached_donors or seq_id in self._parked:
            return
        data = save_sequence(self._lib, self._ctx, seq_id)
        if data is None:
            raise BackendError(f"llama.cpp could not save sequence {seq_id}'s KV")
        self._set_parked(seq_id, ParkedPrefix(data, num_tokens))
        self._lib.llama_memory_seq_rm(self._mem, seq_id, -1, -1)
        if self.cell_order is not None:
            self.cell_order.freed(seq_id)

    def copy_prefix(self, src_seq_id: int, dst_seq_id: int, num_tokens: int) -> None:
        """Give ``dst`` the first ``num_tokens`` positions of ``src``: the same cells, now also
        tagged with ``dst`` (one stream, so no data is copied and no cell is taken), or, from
        a parked donor, its saved bytes restored into ``dst``'s own cells."""
        self._check_open()
        self._set_parked(dst_seq_id, None)
        self._lib.llama_memory_seq_rm(self._mem, dst_seq_id, -1, -1)
        order = self.cell_order
        if order is not None:
            order.freed(dst_seq_id)
        parked = self._parked.get(src_seq_id)
        if parked is None:
            self._lib.llama_memory_seq_cp(self._mem, src_seq_id, dst_seq_id, 0, num_tokens)
            if order is not None:
                order.shared(src_seq_id, dst_seq_id, num_tokens)
            return
        if num_tokens > parked.num_tokens:
            raise BackendError(f"sequence {src_seq_id} keeps {parked.num_tokens} positions; "
                               f"{num_tokens} were asked for")
        data = parked.data if num_tokens == parked.num_tokens else truncate(parked.data, num_tokens)
        if not restore_sequence(self._lib, self._ctx, dst_seq_id, data):
            self._lib.llama_memory_seq_rm(self._mem, dst_seq_id, -1, -1)
            raise BackendError(f"llama.cpp could not restore a cached prefix of {num_tokens} tokens "
                               f"into sequence {dst_seq_id} (no free cells)")
        if order is not None:
            order.placed([dst_seq_id])

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        if pairs:
            raise BackendError("the llama.cpp executor keeps KV per sequence (kv_layout "
                               "'per_sequence'); it has no physical blocks to copy")

    def seq_len(self, seq_id: int) -> int:
        """Positions llama.cpp holds for ``seq_id``, parked or in the pool (for tests and
        diagnostics)."""
        parked = self._parked.get(seq_id)
        if parked is not None:
            return parked.num_tokens
        return int(self._lib.llama_memory_seq_pos_max(self._mem, seq_id)) + 1

    # ------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Free the context (call before the backend's close(), which frees the model)."""
        self._context.close()

    def _check_open(self) -> None:
        if self._context.closed:
            raise BackendError("the llama.cpp executor is closed")


def create_executor(backend: Any, *, max_sequences: int, block_size: int,
                    batch_invariant: bool = False) -> LlamaCppExecutor:
    """An executor over ``backend``'s loaded model: a KV pool of the backend's ``kv_budget_mib``
    shared by ``max_sequences`` sequence ids, one request up to its ``n_ctx``, and a step of up
    to ``n_batch`` tokens. ``batch_invariant``: every row's logits its sequence's alone
    (ruvllm_llamacpp.cell_order), checked on this model and machine before it is returned."""
    opts = backend.options
    # The mode needs flash attention's per-row kernel: "auto" turns it on, an explicit off refuses.
    flash = True if batch_invariant and opts.flash_attn == "auto" else opts.flash_attn
    pool = plan_pool(n_ctx=backend.n_ctx, sequences=max_sequences, bytes_per_token=backend.kv_bytes_per_token,
                     budget_mib=opts.kv_budget_mib, type_k=opts.type_k, type_v=opts.type_v, flash_attn=flash)
    executor = LlamaCppExecutor(
        backend.llama_cpp, backend.model_handle, owner=backend, pool=pool, max_sequences=max_sequences,
        block_size=block_size, max_batch_tokens=backend.n_batch, n_threads=opts.n_threads,
        n_vocab=backend.tokenizer.vocab_size, flash_attn=pool.flash_attn, park_prefixes=opts.park_prefixes,
        batch_invariant=batch_invariant,
    )
    if batch_invariant:
        _check_invariance(backend, executor)
    # A pool that cannot hold one whole context is a limit the user did not ask for: say so loudly.
    log.log(logging.WARNING if pool.over_budget or pool.per_request < pool.n_ctx else logging.INFO,
            "llamacpp executor: %s", pool.describe())
    return executor


def _check_invariance(backend: Any, executor: LlamaCppExecutor) -> None:
    """Refuse the mode where this build's kernels give a row other bits beside other rows."""
    probe = LlamaCppExecutor(
        backend.llama_cpp, backend.model_handle, owner=backend,
        pool=attrs.evolve(executor.pool, tokens=CHECK_CELLS), max_sequences=4, block_size=1,
        max_batch_tokens=64, n_threads=backend.options.n_threads, n_vocab=executor.n_vocab,
        flash_attn=True, park_prefixes=False, batch_invariant=True)
    try:
        text = " ".join(f"word{i} and then some more text about item {i}." for i in range(40))
        reason = check_rows(probe.execute, probe.free, backend.tokenizer.encode(text)[:100])
    finally:
        probe.close()
    if reason is not None:
        executor.close()
        raise BatchInvariantUnsupported("llamacpp", f"{reason} on this machine's llama.cpp build")
