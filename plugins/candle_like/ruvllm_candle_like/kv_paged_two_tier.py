"""The two-tier KV cache inside the paged executor (``kv_cache = "two_tier"`` under the engine).

The engine still owns KV capacity in blocks and hands over block tables; what changes is how
the executor stores a block. Every block has a **cold** home: packed Q4/Q8 codes plus FP16
scale and minimum per (token, head, group of ``group_size`` channels), preallocated for all
``num_blocks`` blocks. A block in some sequence's recent window also holds a **hot** slot: a
16-bit copy in a small pool of ``max_sequences * hot_blocks_per_sequence`` slots. Per block
and token, attention reads the hot copy when the block has one and the dequantised cold codes
otherwise, so memory is the cold store (about 3.5x smaller than FP16 at Q4) plus the small
hot pool.

A step:

1. **Plan** (before the forward). For each entry, every block its new tokens land in is
   either *cold-bound* (among the entry's cold blocks after this step, see ``migrate_tokens``
   below) or in the window. Window blocks get a hot slot (a block whose earlier
   tokens are only cold is *promoted*: dequantised into the slot, which is rare: it needs
   the pool to have run out). Tokens landing in a cold-bound block written from its start
   (a long prefill chunk) are quantised straight into the cold store. A block written from
   its start is fresh: whatever it held before belongs to a freed sequence.
2. **Attend** (per layer). New K/V are written to their hot rows or quantised into their
   cold rows; the step's read set (the unique cold blocks, dequantised, then the unique hot
   slots, then the step's own new K/V) is concatenated into one workspace, and each entry's
   positions ``0 .. end-1`` are gathered from it by an index planned once per step.
3. **Migrate** (after the forward). Hot blocks now among an entry's cold blocks are
   quantised into their cold rows, one batch per layer, and their slots are freed. Each
   token is quantised once, when its block leaves the window: migration costs O(block), with
   no growing buffer and no re-copying of the cold store.

Hot slots are not released when a sequence ends: the engine may keep the block as a cached
prefix. When the pool runs out, the least recently used slot whose block this step does not
need hot is migrated (its block stays valid, in the cold tier) and reused. The pool is sized
so that a step's own needs always fit: a sequence's window touches at most
``(hot_tokens - 1) // block_size + 1 + migrate_blocks`` blocks.

The request-level cache's ``migrate_tokens`` and ``max_kv_tokens`` (``TwoTierSettings``) mean
here:

- ``migrate_tokens``: blocks leave the window in batches of ``migrate_blocks`` =
  ``ceil(migrate_tokens / block_size)`` whole blocks. After a step ending at position ``E``, a
  sequence's first :meth:`PagedTwoTier.cold_blocks` ``(E)`` blocks are cold: the whole blocks
  older than its last ``hot_tokens`` positions, rounded down to a multiple of the batch. The
  rest stay hot, so a sequence keeps between ``hot_tokens`` and ``hot_tokens + migrate_blocks *
  block_size - 1`` positions exact (a larger batch: more of them, fewer migrations);
- ``max_kv_tokens``: the most positions one sequence may hold. No sequence is ever cut: the
  executor states it as its ``max_seq_len`` (:class:`~ruvllm_candle_like.executor.PagedExecutor`),
  which the engine takes as the context one request may use, so a longer request is refused
  (400) instead of having its oldest tokens evicted as the request-level cache does.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from ruvllm.executor import BatchEntry

from ruvllm_candle_like.config import ModelConfig
from ruvllm_candle_like.kv_two_tier import PackedTensor, TwoTierSettings, dequantize, empty_packed, quantize

MIB = 1 << 20


def migrate_blocks(migrate_tokens: int, block_size: int) -> int:
    """Whole blocks per migration batch: ``migrate_tokens`` rounded up to blocks."""
    return -(-migrate_tokens // block_size)


def hot_blocks_per_sequence(hot_tokens: int, block_size: int, batch_blocks: int = 1) -> int:
    """Most blocks a sequence holds hot: those its last ``hot_tokens`` positions touch during a
    step (``(hot_tokens - 1) // block_size + 2``), plus up to ``batch_blocks - 1`` whole blocks
    older than the window that wait for a full migration batch."""
    return (hot_tokens - 1) // block_size + 1 + batch_blocks


def _rows(ids: np.ndarray, block_size: int) -> np.ndarray:
    """Row indices of every token of the blocks (or slots) ``ids``."""
    return (ids[:, None] * block_size + np.arange(block_size)[None, :]).reshape(-1)


class PagedTwoTier:
    """Hot slots + cold store for every layer's K and V, addressed by the engine's block ids."""

    def __init__(self, cfg: ModelConfig, settings: TwoTierSettings, *, num_blocks: int, block_size: int,
                 max_sequences: int, kv_dtype: torch.dtype, device: torch.device):
        self.settings = settings
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.kv_dtype = kv_dtype
        self.device = device
        self.num_layers = cfg.num_layers
        #: Blocks that leave a window together (``migrate_tokens`` in whole blocks).
        self.migrate_blocks = migrate_blocks(settings.migrate_tokens, block_size)
        per_sequence = hot_blocks_per_sequence(settings.hot_tokens, block_size, self.migrate_blocks)
        self.num_slots = min(num_blocks, max_sequences * per_sequence)
        h, d = cfg.num_kv_heads, cfg.head_dim
        hot_shape = (self.num_slots * block_size, h, d)
        # Zeros: padded gather positions are masked, but NaN garbage would still poison SDPA.
        self.hot_k = [torch.zeros(hot_shape, dtype=kv_dtype, device=device) for _ in range(cfg.num_layers)]
        self.hot_v = [torch.zeros(hot_shape, dtype=kv_dtype, device=device) for _ in range(cfg.num_layers)]
        rows = num_blocks * block_size
        bits, group = settings.bits, settings.group_size
        self.cold_k = [empty_packed(rows, h, d, bits, group, device) for _ in range(cfg.num_layers)]
        self.cold_v = [empty_packed(rows, h, d, bits, group, device) for _ in range(cfg.num_layers)]
        #: Hot slot of each block (-1: the block lives in the cold tier only).
        self.hot_slot = np.full(num_blocks, -1, dtype=np.int64)
        #: Block of each hot slot (-1: free), and the step that last used it (for eviction).
        self.slot_block = np.full(self.num_slots, -1, dtype=np.int64)
        self.slot_used = np.zeros(self.num_slots, dtype=np.int64)
        self._free_slots = list(range(self.num_slots - 1, -1, -1))  # pop() gives the lowest
        self._clock = 0
        #: Counters: blocks quantised when leaving a window, when their slot was needed
        #: elsewhere, and blocks dequantised back into a slot.
        self.migrated_blocks = 0
        self.evicted_blocks = 0
        self.promoted_blocks = 0
        #: Bytes a 16-bit pool of the same token capacity would take (for describe()).
        width = torch.empty((), dtype=kv_dtype).element_size()
        self.fp16_equivalent = 2 * cfg.num_layers * rows * h * d * width

    # ------------------------------------------------------------------ accounting

    def hot_nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.hot_k, *self.hot_v))

    def cold_nbytes(self) -> int:
        return sum(p.nbytes() for p in (*self.cold_k, *self.cold_v))

    def nbytes(self) -> int:
        return self.hot_nbytes() + self.cold_nbytes()

    def sequence_nbytes(self, block_table: Sequence[int]) -> int:
        """Bytes holding one sequence's blocks: each block's cold rows, plus its hot slot's
        rows when it has one."""
        blocks = np.unique(np.asarray(block_table, dtype=np.int64))
        per_row_cold = self.cold_nbytes() // (self.num_blocks * self.block_size)
        per_row_hot = self.hot_nbytes() // (self.num_slots * self.block_size)
        hot = int((self.hot_slot[blocks] >= 0).sum())
        return self.block_size * (len(blocks) * per_row_cold + hot * per_row_hot)

    def cold_blocks(self, end: int) -> int:
        """How many of a sequence's first blocks are cold once it holds positions ``0 .. end-1``:
        the whole blocks older than its last ``hot_tokens`` positions, in whole migration batches."""
        whole = max(0, end - self.settings.hot_tokens) // self.block_size
        return whole - whole % self.migrate_blocks

    def tiers(self, block_table: Sequence[int], length: int) -> tuple[int, int]:
        """(positions held hot, positions held cold only) of a sequence of ``length`` positions."""
        bs = self.block_size
        n = -(-length // bs)
        slots = self.hot_slot[np.asarray(block_table[:n], dtype=np.int64)]
        sizes = np.full(n, bs)
        if n:
            sizes[-1] = length - (n - 1) * bs
        hot = int(sizes[slots >= 0].sum())
        return hot, length - hot

    def describe(self) -> str:
        s = self.settings
        dtype = str(self.kv_dtype).removeprefix("torch.")
        total = self.nbytes()
        tokens = self.num_blocks * self.block_size
        return (f"two-tier KV cache (kv_cache=two_tier): cold tier Q{s.bits} (group {s.group_size}) "
                f"for {tokens} tokens {self.cold_nbytes() / MIB:.1f} MiB + {dtype} hot window of the "
                f"last {s.hot_tokens} tokens per sequence, migrated {self.migrate_blocks * self.block_size} "
                f"at a time "
                f"({self.num_slots} blocks of {self.block_size}) "
                f"{self.hot_nbytes() / MIB:.1f} MiB = {total / MIB:.1f} MiB; a {dtype} pool would take "
                f"{self.fp16_equivalent / MIB:.1f} MiB ({self.fp16_equivalent / total:.2f}x)")

    # ------------------------------------------------------------------ cold rows

    def _write_cold(self, store: PackedTensor, rows: torch.Tensor, x: torch.Tensor) -> None:
        p = quantize(x, self.settings.bits, self.settings.group_size)
        store.codes.index_copy_(0, rows, p.codes)
        store.scale.index_copy_(0, rows, p.scale)
        store.minimum.index_copy_(0, rows, p.minimum)

    def _read_cold(self, store: PackedTensor, rows: torch.Tensor) -> torch.Tensor:
        held = PackedTensor(store.codes.index_select(0, rows), store.scale.index_select(0, rows),
                            store.minimum.index_select(0, rows))
        return dequantize(held, self.settings.bits, self.settings.group_size, self.kv_dtype)

    # ------------------------------------------------------------------ slots

    def _release(self, block: int) -> None:
        slot = int(self.hot_slot[block])
        self.hot_slot[block] = -1
        self.slot_block[slot] = -1
        self._free_slots.append(slot)

    def _take_slot(self, block: int, keep: set[int]) -> int:
        """A hot slot for ``block``; when none is free, the least recently used slot whose block
        is not in ``keep`` is migrated to the cold tier first."""
        if not self._free_slots:
            held = self.slot_block
            candidates = np.flatnonzero(~np.isin(held, np.fromiter(keep, dtype=np.int64, count=len(keep))))
            if not len(candidates):  # cannot happen with the pool sized per sequence
                raise RuntimeError("candle_like two-tier KV: no hot slot can be freed")
            victim = int(candidates[np.argmin(self.slot_used[candidates])])
            self.migrate(np.array([held[victim]]))
            self.evicted_blocks += 1
        slot = self._free_slots.pop()
        self.hot_slot[block] = slot
        self.slot_block[slot] = block
        self.slot_used[slot] = self._clock
        return slot

    def _promote(self, block: int, slot: int) -> None:
        bs = self.block_size
        cold_rows = torch.arange(block * bs, (block + 1) * bs, device=self.device)
        hot_rows = slice(slot * bs, (slot + 1) * bs)
        for layer in range(self.num_layers):
            for hot, cold in ((self.hot_k, self.cold_k), (self.hot_v, self.cold_v)):
                hot[layer][hot_rows] = self._read_cold(cold[layer], cold_rows)
        self.promoted_blocks += 1

    @torch.inference_mode()
    def migrate(self, blocks: np.ndarray) -> None:
        """Quantise the hot copies of ``blocks`` into their cold rows and free their slots."""
        if not len(blocks):
            return
        slots = self.hot_slot[blocks]
        hot_rows = torch.from_numpy(_rows(slots, self.block_size)).to(self.device)
        cold_rows = torch.from_numpy(_rows(blocks, self.block_size)).to(self.device)
        for layer in range(self.num_layers):
            for hot, cold in ((self.hot_k, self.cold_k), (self.hot_v, self.cold_v)):
                self._write_cold(cold[layer], cold_rows, hot[layer].index_select(0, hot_rows))
        for b in blocks.tolist():
            self._release(b)

    @torch.inference_mode()
    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: ``dst`` gets ``src``'s tier and contents."""
        bs = self.block_size
        keep = {b for pair in pairs for b in pair}
        for src, dst in pairs:
            if src == dst:
                continue
            src_slot = int(self.hot_slot[src])
            if src_slot >= 0:
                dst_slot = int(self.hot_slot[dst])
                if dst_slot < 0:
                    dst_slot = self._take_slot(dst, keep)
                s, d = slice(src_slot * bs, (src_slot + 1) * bs), slice(dst_slot * bs, (dst_slot + 1) * bs)
                for pool in (*self.hot_k, *self.hot_v):
                    pool[d] = pool[s]
                self.slot_used[dst_slot] = self._clock
            else:
                if self.hot_slot[dst] >= 0:
                    self._release(dst)
                s, d = slice(src * bs, (src + 1) * bs), slice(dst * bs, (dst + 1) * bs)
                for store in (*self.cold_k, *self.cold_v):
                    for t in (store.codes, store.scale, store.minimum):
                        t[d] = t[s]

    # ------------------------------------------------------------------ steps

    @torch.inference_mode()
    def begin(self, batch: Sequence[BatchEntry]) -> TwoTierStep:
        """Assign tiers for this step's writes and plan its reads (see the module docstring)."""
        self._clock += 1
        bs = self.block_size
        tables = [np.asarray(e.block_table, dtype=np.int64) for e in batch]
        keep: set[int] = set()
        wanted: list[tuple[int, bool]] = []
        for e, table in zip(batch, tables, strict=True):
            start, end = e.start_pos, e.start_pos + len(e.tokens)
            n_cold = self.cold_blocks(end)
            for i in range(start // bs, (end - 1) // bs + 1):
                b = int(table[i])
                fresh = start <= i * bs
                if i < n_cold:  # cold-bound: no slot needed
                    if fresh and self.hot_slot[b] >= 0:
                        self._release(b)  # what the slot held belongs to a freed sequence
                else:
                    keep.add(b)
                    if self.hot_slot[b] < 0:
                        wanted.append((b, fresh))
        for b, fresh in wanted:
            if self.hot_slot[b] >= 0:
                continue
            slot = self._take_slot(b, keep)
            if not fresh:
                self._promote(b, slot)

        # Reads: positions before start_pos come from the cold blocks or hot slots they live
        # in; new positions from this step's K/V.
        past: list[tuple[np.ndarray, np.ndarray, int]] = []  # (blocks, their slots, start)
        for e, table in zip(batch, tables, strict=True):
            n_blocks = -(-e.start_pos // bs)
            blocks = table[:n_blocks]
            past.append((blocks, self.hot_slot[blocks], e.start_pos))
        empty = np.zeros(0, dtype=np.int64)
        cold_ids = np.unique(np.concatenate([b[s < 0] for b, s, _ in past] or [empty]))
        hot_ids = np.unique(np.concatenate([s[s >= 0] for _, s, _ in past] or [empty]))
        n_cold_rows, n_hot_rows = len(cold_ids) * bs, len(hot_ids) * bs
        new_base = n_cold_rows + n_hot_rows
        gathers: list[np.ndarray] = []
        hot_src, hot_dst, cold_src, cold_dst = [], [], [], []
        row = 0
        for e, table, (blocks, slots, start) in zip(batch, tables, past, strict=True):
            n = len(e.tokens)
            base = np.where(slots >= 0, n_cold_rows + np.searchsorted(hot_ids, slots) * bs,
                            np.searchsorted(cold_ids, blocks) * bs)
            past_rows = (base[:, None] + np.arange(bs)[None, :]).reshape(-1)[:start]
            gathers.append(np.concatenate([past_rows, new_base + row + np.arange(n)]))
            pos = np.arange(start, start + n)
            blk = table[pos // bs]
            off = pos % bs
            where = self.hot_slot[blk]
            hot = where >= 0
            hot_src.append(row + np.flatnonzero(hot))
            hot_dst.append(where[hot] * bs + off[hot])
            cold_src.append(row + np.flatnonzero(~hot))
            cold_dst.append(blk[~hot] * bs + off[~hot])
            self.slot_used[where[hot]] = self._clock
            row += n
        self.slot_used[hot_ids] = self._clock
        return TwoTierStep(self, batch, gathers, cold_rows=_rows(cold_ids, bs), hot_rows=_rows(hot_ids, bs),
                           hot_src=np.concatenate(hot_src), hot_dst=np.concatenate(hot_dst),
                           cold_src=np.concatenate(cold_src), cold_dst=np.concatenate(cold_dst))

    def finish(self, batch: Sequence[BatchEntry]) -> None:
        """Migrate the hot blocks that are now older than their entry's window (in whole batches
        of ``migrate_blocks``)."""
        leaving = []
        for e in batch:
            n_bound = self.cold_blocks(e.start_pos + len(e.tokens))
            if n_bound > 0:
                blocks = np.asarray(e.block_table[:n_bound], dtype=np.int64)
                leaving.append(blocks[self.hot_slot[blocks] >= 0])
        if leaving:
            blocks = np.unique(np.concatenate(leaving))
            self.migrate(blocks)
            self.migrated_blocks += len(blocks)


class TwoTierStep:
    """One step's plan: where new K/V go, what the workspace holds, each entry's gather."""

    def __init__(self, pool: PagedTwoTier, batch: Sequence[BatchEntry], gathers: list[np.ndarray], *,
                 cold_rows: np.ndarray, hot_rows: np.ndarray, hot_src: np.ndarray, hot_dst: np.ndarray,
                 cold_src: np.ndarray, cold_dst: np.ndarray):
        dev = pool.device
        self.pool = pool
        self.batch = batch
        self._gathers = gathers

        def tensor(a: np.ndarray) -> torch.Tensor | None:
            return torch.from_numpy(a).to(dev) if len(a) else None

        self.cold_rows, self.hot_rows = tensor(cold_rows), tensor(hot_rows)
        self.hot_src, self.hot_dst = tensor(hot_src), tensor(hot_dst)
        self.cold_src, self.cold_dst = tensor(cold_src), tensor(cold_dst)

    def gather(self, i: int) -> np.ndarray:
        """Workspace rows of positions ``0 .. end-1`` of entry ``i``."""
        return self._gathers[i]

    def sources(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store this step's K/V of ``layer`` and return the K and V workspaces."""
        pool = self.pool
        out = []
        for x, hot, cold in ((k, pool.hot_k[layer], pool.cold_k[layer]),
                             (v, pool.hot_v[layer], pool.cold_v[layer])):
            x16 = x.to(pool.kv_dtype)
            if self.hot_dst is not None:
                hot.index_copy_(0, self.hot_dst, x16.index_select(0, self.hot_src))
            if self.cold_dst is not None:
                pool._write_cold(cold, self.cold_dst, x.index_select(0, self.cold_src))
            parts = []
            if self.cold_rows is not None:
                parts.append(pool._read_cold(cold, self.cold_rows))
            if self.hot_rows is not None:
                parts.append(hot.index_select(0, self.hot_rows))
            parts.append(x16)
            out.append(torch.cat(parts) if len(parts) > 1 else x16)
        return out[0], out[1]

    def finish(self) -> None:
        self.pool.finish(self.batch)
