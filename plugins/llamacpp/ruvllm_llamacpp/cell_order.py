"""The llama.cpp executor's batch-invariant mode (``[engine] batch_invariant``): a row's logits
are a function of its own sequence only, whatever else shares the step or the pool.

What llama.cpp's CPU kernels do with a row (ggml-cpu/ops.cpp, measured by
``benchmarks/llamacpp_row_invariance.py``; docs/engine.md, "Batch-invariant mode"):

- The weights' matrix products give a row the same bits at every row count on the builds
  measured; :func:`check_rows` checks it on the loaded model when an executor is built with the
  mode, since other CPU kinds' kernels (llamafile's sgemm, AMX) may group rows.
- Flash attention has three kernels. Micro-batches of 64 rows or more take a tiled one (its sums
  group by 64-cell tiles), and a micro-batch of ONE row over 512 cells or more a split-KV one (its
  sums depend on the split point). Every other micro-batch takes the per-row kernel: an online
  softmax over the cells in buffer order that skips other sequences' (masked) cells exactly. So
  the mode runs micro-batches of :data:`INVARIANT_UBATCH` rows and pads a step whose last
  micro-batch would hold one row (:func:`needs_pad`) with a row of the spare sequence.
- The per-row kernel still sums a sequence's cells in buffer order, and llama.cpp gives a new
  token the lowest free cell once cells below its search head are freed (``find_slot``), so after
  another request finishes a sequence's next cell can land below its earlier ones. No API places
  cells, so :class:`CellOrder` keeps the pool free of holes instead: after a free or a trim it
  saves every sequence in the pool, clears it, and restores them packed, each in position order
  (same bytes, so the same K/V), before the next step. New cells are then always taken above
  every cell in use, in step order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import attrs
import numpy as np
from ruvllm.errors import BackendError
from ruvllm.executor import BatchEntry

from ruvllm_llamacpp.parked import restore_sequence, save_sequence, select

#: Bytes of a sequence state with no cells: magic, sequence id, stream count, cell count.
_EMPTY_STATE = 16
#: Rows per micro-batch: below flash attention's 64-row tile, so every row takes the per-row kernel.
INVARIANT_UBATCH = 63


def needs_pad(n_tokens: int) -> bool:
    """Whether a step of ``n_tokens`` would end with a one-row micro-batch (the split-KV kernel
    over a long sequence): then the executor adds one row of the spare sequence."""
    return n_tokens % INVARIANT_UBATCH == 1


@attrs.define
class CellOrder:
    """Which sequences hold cells in the pool, which share cells (``copy_prefix`` of a running
    sequence tags the same cells with both ids), and whether a free or trim left a hole; and the
    compaction that removes the holes. ``spare`` is a sequence id the engine never uses (the
    padding row's, and a restore's staging id)."""

    lib: ModuleType
    ctx: Any
    mem: Any
    spare: int
    live: set[int] = attrs.field(factory=set)
    #: dst -> (src, n): dst's first n positions are src's cells.
    shares: dict[int, tuple[int, int]] = attrs.field(factory=dict)
    dirty: bool = False
    #: Compactions run (for tests and the cost figures in docs/engine.md).
    compactions: int = 0

    def placed(self, seq_ids: Sequence[int]) -> None:
        self.live.update(seq_ids)

    def shared(self, src: int, dst: int, num_tokens: int) -> None:
        self.live.add(dst)
        if num_tokens > 0:
            self.shares[dst] = (src, num_tokens)

    def freed(self, seq_id: int) -> None:
        if seq_id in self.live:
            self.live.discard(seq_id)
            self.dirty = True
        self.shares.pop(seq_id, None)
        # Cells seq_id shared with others stay, theirs alone now.
        self.shares = {dst: share for dst, share in self.shares.items() if share[0] != seq_id}

    def trimmed(self, seq_id: int, num_tokens: int) -> None:
        if seq_id not in self.live:
            return
        self.dirty = True
        self.shares = {dst: (src, min(n, num_tokens) if seq_id in (src, dst) else n)
                       for dst, (src, n) in self.shares.items()}

    def compact(self) -> None:
        """Restore every sequence in the pool packed and in position order, sharing what it
        shared; a no-op unless a free or trim may have left a hole."""
        if not self.dirty:
            return
        self.dirty = False
        lib = self.lib
        if not self.live:
            lib.llama_memory_clear(self.mem, False)  # the search head back to cell 0
            return
        saved = {seq: self._save(seq) for seq in self.live}
        lib.llama_memory_clear(self.mem, False)
        for seq in _sources_first(saved, self.shares):
            src, n = self.shares.get(seq, (None, 0))
            if src is None:
                self._restore(seq, select(saved[seq], 0))
                continue
            lib.llama_memory_seq_cp(self.mem, src, seq, 0, n)
            tail = select(saved[seq], n)
            if len(tail) > _EMPTY_STATE:  # cells of its own past the shared ones
                self._restore(self.spare, tail)
                lib.llama_memory_seq_cp(self.mem, self.spare, seq, -1, -1)
                lib.llama_memory_seq_rm(self.mem, self.spare, -1, -1)
        self.compactions += 1

    def _save(self, seq_id: int) -> bytes:
        data = save_sequence(self.lib, self.ctx, seq_id)
        if data is None:
            raise BackendError(f"llama.cpp could not save sequence {seq_id}'s KV to keep the pool in order")
        return data

    def _restore(self, seq_id: int, data: bytes) -> None:
        if not restore_sequence(self.lib, self.ctx, seq_id, data):
            raise BackendError(f"llama.cpp could not restore sequence {seq_id}'s KV while keeping the "
                               "pool in order")


def _sources_first(seqs: dict[int, bytes], shares: dict[int, tuple[int, int]]) -> list[int]:
    """``seqs`` ordered so that a sequence comes after the one it shares cells with."""
    order: list[int] = []
    done: set[int] = set()

    def visit(seq: int) -> None:
        if seq in done:
            return
        done.add(seq)
        src = shares.get(seq, (None,))[0]
        if src is not None and src in seqs:
            visit(src)
        order.append(seq)

    for seq in sorted(seqs):
        visit(seq)
    return order


def check_rows(execute: Callable[[list[BatchEntry]], np.ndarray], free: Callable[[int], None],
               tokens: list[int]) -> str | None:
    """Run one prompt's rows alone, beside other sequences and in chunks through ``execute`` (a
    fresh executor in the mode, sequence ids 0-3 free) and compare the logits bit for bit; what
    differed, or None. Covers the weights' products at several row counts (kernels other CPU
    kinds may choose by rows) and attention over cells shared with other sequences."""
    prompt, other = tokens[:40], tokens[40:70]

    def entry(seq: int, toks: list[int], start: int, sample: bool = True) -> BatchEntry:
        return BatchEntry(seq_id=seq, tokens=toks, start_pos=start, sample=sample, block_table=[])

    try:
        alone = execute([entry(0, prompt, 0)])[0]
        decode_alone = execute([entry(0, [tokens[40]], 40)])[0]
        execute([entry(1, other, 0, False)])
        execute([entry(2, prompt[:13], 0, False), entry(1, [tokens[70]], 30, False)])
        beside = execute([entry(1, [tokens[71]], 31), entry(2, prompt[13:], 13),
                          entry(3, other[:20], 0)])
        decode_beside = execute([entry(3, [tokens[90]], 20), entry(2, [tokens[40]], 40),
                                 entry(1, [tokens[72]], 32)])
    finally:
        for seq in range(4):
            free(seq)
    if not np.array_equal(alone, beside[1]):
        return "a prompt's last row differed prefilled alone and in chunks beside other sequences"
    if not np.array_equal(decode_alone, decode_beside[1]):
        return "a decode row differed alone and beside other sequences' rows"
    return None
