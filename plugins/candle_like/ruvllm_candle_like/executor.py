"""The iteration-level executor: ONE forward pass per engine step over a mixed batch.

KV lives in a paged pool per layer, ``[num_blocks * block_size, Hkv, D]``, addressed through the
block tables the engine hands over: position ``p`` of a sequence is slot
``block_table[p // block_size] * block_size + p % block_size``. A step flattens every entry's
new tokens (prefill chunks and decode tokens alike) into one token list, so every projection
and MLP matmul reads the weights once for the whole batch. Attention is the only per-sequence
part:

- decode entries (one new token each) are attended together in one batched
  ``scaled_dot_product_attention`` over their gathered, padded KV with a validity mask;
- prefill chunks are attended one by one over their gathered past with a causal mask.

Storage is one of two kinds, chosen by the backend's ``kv_cache`` option:

- ``fp16``: a 16-bit pool per layer, ``[num_blocks * block_size, 2, Hkv, D]`` (a slot's K and V
  side by side), written in place and gathered from directly, K and V in one op each
  (:class:`_PoolStep`);
- ``two_tier``: :class:`~ruvllm_candle_like.kv_paged_two_tier.PagedTwoTier`, packed Q4/Q8 cold
  rows for every block plus 16-bit hot slots for the blocks in each sequence's recent window;
  a step gathers from a per-layer workspace of the cold blocks it reads (dequantised), the hot
  slots it reads and its own new K/V.

Either way a step object says where each entry's positions are (``gather``), stores a layer's
new K/V and hands back the tensors to gather from (``sources``), and ``finish`` runs after the
forward (the two-tier cache migrates blocks that left their window there).
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
from collections.abc import Callable, Sequence

import attrs
import numpy as np
import torch
from ruvllm.errors import BackendError, InvalidRequest
from ruvllm.executor import BatchEntry

from ruvllm_candle_like import paged_attention
from ruvllm_candle_like.attention_ops import attend_decode_batch, attend_sequence
from ruvllm_candle_like.decode_graph import DecodeGraph, unsupported
from ruvllm_candle_like.invariant import (
    attend_tiled,
    hidden_keys,
    invariant_twin,
    pad_rows,
    tiled_length,
    whole_blocks,
)
from ruvllm_candle_like.kv_paged_two_tier import MIB, PagedTwoTier, TwoTierStep
from ruvllm_candle_like.kv_two_tier import TwoTierSettings
from ruvllm_candle_like.lora import AdapterRegistry, LoraAdapter, LoraPlan
from ruvllm_candle_like.model import Transformer

KeysValues = tuple[torch.Tensor, torch.Tensor]

log = logging.getLogger(__name__)


@attrs.frozen
class _Prefill:
    rows: slice
    gather: torch.Tensor  # slots of positions 0 .. start+T-1
    start: int


class _PoolStep:
    """One step over the 16-bit pool: positions are pool slots, new K/V are written in place.

    K and V of a slot sit side by side (``[slots, 2, Hkv, D]``), so a layer writes its new K/V
    with one ``index_copy_`` and reads a gather's K and V with one ``index_select`` and one
    conversion to the compute dtype: half the small ops per layer of separate K and V pools,
    each of which costs a parallel region (docs/benchmark.md, candle_like at 16 sequences)."""

    #: :meth:`sources` returns one pool holding K and V (see _StepAttention.attend).
    paired = True

    def __init__(self, ex: PagedExecutor, batch: Sequence[BatchEntry]):
        self.ex = ex
        self.batch = batch
        slots = [ex._slots(e.block_table, e.start_pos, e.start_pos + len(e.tokens)) for e in batch]
        self.slots = torch.from_numpy(np.concatenate(slots)).to(ex.device)

    def gather(self, i: int) -> np.ndarray:
        e = self.batch[i]
        return self.ex._slots(e.block_table, 0, e.start_pos + len(e.tokens))

    def sources(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        ex = self.ex
        pool = ex.kv[layer]
        pool.index_copy_(0, self.slots, torch.stack((k, v), dim=1).to(ex.kv_dtype))
        return pool

    def finish(self) -> None:
        return None


class _KvAccess:
    """What both attention plans do with a step's KV: store a layer's new K/V, read positions."""

    def __init__(self, ex: PagedExecutor, kv: _PoolStep | TwoTierStep):
        self.ex = ex
        self.kv = kv

    def _read(self, pool: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        out = pool.index_select(0, index)
        return out if out.dtype == self.ex.compute_dtype else out.to(self.ex.compute_dtype)

    def _pool_reader(self, pool: torch.Tensor) -> Callable[[torch.Tensor], KeysValues]:
        """What reads K and V of positions of a paired pool (``[slots, 2, Hkv, D]``)."""

        def read(index: torch.Tensor) -> KeysValues:
            keys, values = self._read(pool, index).unbind(1)
            return keys, values
        return read

    def _reader(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> Callable[[torch.Tensor], KeysValues]:
        """Store the layer's new K/V; return what reads K and V of pool positions."""
        if getattr(self.kv, "paired", False):
            return self._pool_reader(self.kv.sources(layer, k, v))
        else:
            k_pool, v_pool = self.kv.sources(layer, k, v)

            def read(index: torch.Tensor) -> KeysValues:
                return self._read(k_pool, index), self._read(v_pool, index)
        return read


#: A chunk of up to this many rows (a speculative verification, a short new turn) attends on
#: the native pool kernel row by row, the bits of decoding each row, after any prefix.
NATIVE_CHUNK_ROWS = 24
#: So does a longer chunk whose last row reads at most this many keys: every chunk of a prompt
#: of up to 1,024 tokens, in any chunking. The kernel reads each row's keys alone and SDPA's
#: kernel tiles them (after a prefix with a mask over every key), so past these bounds SDPA is
#: faster. A first token at one client, every chunk native against the bounds before (16 rows
#: or 64 x 64 keys; both kinds, 2026-12-07): 0.79-0.95x at 128-512 tokens from position 0 or
#: after 512 cached ones (up to 1,024 keys), 0.92-1.02x at 1,088-1,536 keys, 0.86-0.96x for 24
#: new tokens after 2,048-4,096 cached ones; 32 new tokens there 1.08x on AVX-512 (0.91-0.96x
#: held to AVX2), 64-512 new ones 1.07-1.33x on both.
NATIVE_CHUNK_KEYS = 1024


def on_native_kernel(start: int, rows: int) -> bool:
    """Whether a chunk of ``rows`` new positions from ``start`` attends on the native kernel."""
    return rows <= NATIVE_CHUNK_ROWS or start + rows <= NATIVE_CHUNK_KEYS


class _StepAttention(_KvAccess):
    """The PyTorch per-step plan the model's forward calls back into for each layer: decode
    rows in one padded SDPA batch, prefill chunks one by one."""

    def __init__(self, ex: PagedExecutor, kv: _PoolStep | TwoTierStep, decode_rows: torch.Tensor | None,
                 decode_gather: torch.Tensor | None, decode_valid: torch.Tensor | None,
                 prefills: list[_Prefill], all_decode_in_order: bool):
        super().__init__(ex, kv)
        self.decode_rows = decode_rows
        self.decode_gather = decode_gather
        self.decode_valid = decode_valid
        self.prefills = prefills
        self.all_decode_in_order = all_decode_in_order

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        read = self._reader(layer, k, v)
        t, h, d = q.shape
        h_kv = k.shape[1]
        if self.decode_gather is not None:
            rows = q if self.all_decode_in_order else q[self.decode_rows]
            b, length = self.decode_gather.shape
            keys, values = read(self.decode_gather.reshape(-1))
            keys = keys.view(b, length, h_kv, d).transpose(1, 2)
            values = values.view(b, length, h_kv, d).transpose(1, 2)
            decoded = attend_decode_batch(rows, keys, values, self.decode_valid)
            if self.all_decode_in_order:
                return decoded
        out = q.new_empty((t, h * d))
        if self.decode_gather is not None:
            out[self.decode_rows] = decoded
        for p in self.prefills:
            keys, values = read(p.gather)
            out[p.rows] = attend_sequence(q[p.rows], keys.transpose(0, 1), values.transpose(0, 1), p.start)
        return out


class _NativeStepAttention(_KvAccess):
    """The per-step plan on the native kernel (paged_attention.py): decode rows and the rows of
    the chunks :func:`on_native_kernel` gives it attend straight from the float16 pool, each over
    its own prefix; other chunks through SDPA's causal kernel. The native decoder runs it itself
    (:class:`~ruvllm_candle_like.native_decoder.PoolAttention`, as ``native_pool``)."""

    def __init__(self, ex: PagedExecutor, kv: _PoolStep, batch: Sequence[BatchEntry]):
        super().__init__(ex, kv)
        gathers = [kv.gather(i) for i in range(len(batch))]
        counts = [len(e.tokens) for e in batch]
        native = [on_native_kernel(e.start_pos, n) for e, n in zip(batch, counts, strict=True)]
        self.rows = paged_attention.PoolRows.of_entries(gathers, [e.start_pos for e in batch], counts, native)
        self.long: list[_Prefill] = []
        row = 0
        for e, gather, n, here in zip(batch, gathers, counts, native, strict=True):
            if not here:
                self.long.append(_Prefill(slice(row, row + n), torch.from_numpy(gather), e.start_pos))
            row += n
        self.hooked_rows = sum(p.rows.stop - p.rows.start for p in self.long)
        self.write_slots = kv.slots
        self.pool_pointers = ex.pool_pointers
        self.native_pool = self

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        pool = self.kv.sources(layer, k, v)
        out = paged_attention.attend(q, pool, self.rows)
        self.attend_rest(layer, q, out)
        return out.to(q.dtype)

    def attend_rest(self, layer: int, q: torch.Tensor, out: torch.Tensor) -> None:
        """The long chunks' rows of ``out``, over K/V already in the pool."""
        if not self.long:
            return
        read = self._pool_reader(self.ex.kv[layer])
        for p in self.long:
            keys, values = read(p.gather)
            out[p.rows] = attend_sequence(q[p.rows], keys.transpose(0, 1), values.transpose(0, 1), p.start)


class _InvariantAttention(_KvAccess):
    """The batch-invariant plan (:mod:`ruvllm_candle_like.invariant`): the decode entries of a
    step attend together, each over its own keys padded to whole tiles, and each prefill chunk
    alone; every query meets the same kernels whatever shares the step.

    Attention runs head-major (``[Hkv, B, rows, D]``): the pool's K/V are gathered straight into
    that layout, where a sequence-major batch would copy every gathered K and V once more."""

    def __init__(self, ex: PagedExecutor, kv: _PoolStep, batch: Sequence[BatchEntry]):
        super().__init__(ex, kv)
        dev = ex.device
        cfg = ex.model.cfg
        self.group = g = cfg.num_heads // cfg.num_kv_heads
        decode_rows: list[int] = []
        decode_gathers: list[np.ndarray] = []
        self.chunks: list[tuple[slice, torch.Tensor, torch.Tensor]] = []
        row = 0
        for i, e in enumerate(batch):
            n = len(e.tokens)
            gather = kv.gather(i)
            if n == 1:
                decode_rows.append(row)
                decode_gathers.append(gather)
            else:
                # Rows in (head, token) order, as the GQA view lays them out.
                pos = (torch.arange(e.start_pos, e.start_pos + n, device=dev)).repeat(g)
                pos = torch.cat([pos, pos.new_zeros(whole_blocks(len(pos)) - len(pos))])
                length = tiled_length(len(gather))
                self.chunks.append((slice(row, row + n), self._padded(gather, length),
                                    hidden_keys(pos, length)[None, None]))
            row += n
        self.decode: tuple[slice | torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if decode_rows:
            length = tiled_length(max(len(x) for x in decode_gathers))
            gathers = torch.stack([self._padded(x, length) for x in decode_gathers])
            pos = torch.zeros((len(decode_rows), whole_blocks(g)), dtype=torch.long, device=dev)
            pos[:, :g] = torch.tensor([len(x) - 1 for x in decode_gathers], device=dev)[:, None]
            hidden = hidden_keys(pos.view(-1), length).view(*pos.shape, length)
            # A step of decodes alone has them in rows 0..B-1: a slice, not a gather and a scatter.
            leading = decode_rows == list(range(len(decode_rows)))
            rows = slice(0, len(decode_rows)) if leading else torch.tensor(decode_rows, device=dev)
            self.decode = (rows, gathers, hidden[None])

    def _padded(self, gather: np.ndarray, length: int) -> torch.Tensor:
        """The slots of ``gather``, then its first slot again up to ``length`` (masked keys)."""
        out = np.full(length, gather[0], dtype=np.int64)
        out[: len(gather)] = gather
        return torch.from_numpy(out).to(self.ex.device)

    def _head_major(self, layer: int, k: torch.Tensor,
                    v: torch.Tensor) -> Callable[[torch.Tensor], KeysValues]:
        """Store the layer's new K/V; return what reads K and V of pool positions as [Hkv, N, D]."""
        pool = self.kv.sources(layer, k, v)  # [slots, 2, Hkv, D]

        def read(index: torch.Tensor) -> KeysValues:
            # Whole slots gathered (contiguous rows, the fast way), then one copy that converts
            # to the compute dtype and transposes to [2, Hkv, N, D] at once.
            rows = pool.index_select(0, index).permute(1, 2, 0, 3)
            out = rows.new_empty(rows.shape, dtype=self.ex.compute_dtype)
            out.copy_(rows)
            return out[0], out[1]
        return read

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        read = self._head_major(layer, k, v)
        t, h, d = q.shape
        h_kv, g = k.shape[1], self.group
        out = q.new_empty((t, h * d))
        if self.decode is not None:
            rows, gathers, hidden = self.decode
            b, length = gathers.shape
            keys, values = read(gathers.reshape(-1))
            # [B, Hkv, G, D] -> [G, Hkv, B, D], padded -> [Hkv, B, rows, D]
            qd = pad_rows(q[rows].view(b, h_kv, g, d).permute(2, 1, 0, 3)).permute(1, 2, 0, 3)
            att = attend_tiled(qd, keys.view(h_kv, b, length, d), values.view(h_kv, b, length, d), hidden)
            att = att[:, :, :g].permute(1, 0, 2, 3).reshape(b, h * d)
            if not self.chunks and isinstance(rows, slice):
                return att
            out[rows] = att
        for span, gather, hidden in self.chunks:
            keys, values = read(gather)
            n = span.stop - span.start
            qp = pad_rows(q[span].view(n, h_kv, g, d).permute(2, 0, 1, 3).reshape(g * n, h_kv, d))
            att = attend_tiled(qp.transpose(0, 1)[:, None], keys[:, None], values[:, None], hidden)
            out[span] = att[:, 0, : g * n].reshape(h_kv, g, n, d).permute(2, 0, 1, 3).reshape(n, h * d)
        return out


def zeroed_pool(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zero tensor for a KV pool. On CPU its pages come from an anonymous mapping, which the OS
    maps zero-filled on first write: the pool's memory becomes resident as sequences fill it,
    not at start-up (an idle server with the embedded model's 11,520-token pool: 462 MB RSS
    instead of 727 MB), and the pool keeps its capacity."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = math.prod(shape) * dtype.itemsize
    # The tensor keeps the mapping alive (torch.frombuffer holds a reference to the buffer).
    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype).view(shape)


class PagedExecutor:
    """:class:`ruvllm.executor.BatchExecutor` over a :class:`Transformer` with a paged KV pool."""

    kv_layout = "paged"
    #: Honours ``BatchEntry.all_logits`` (prompt logprobs).
    prompt_logits = True

    def __init__(self, model: Transformer, *, max_sequences: int, block_size: int, num_tokens: int,
                 max_batch_tokens: int, kv_dtype: torch.dtype, adapters: AdapterRegistry | None = None,
                 two_tier: TwoTierSettings | None = None, max_seq_len: int | None = None,
                 batch_invariant: bool = False, rows_check: Callable[[], str | None] | None = None,
                 compile_decode: bool = False):
        """``two_tier``: keep KV in the two-tier cache (packed cold store + 16-bit hot window)
        instead of the 16-bit pool. ``max_seq_len``: the most positions one sequence may hold
        (default and at most the model's context; the two-tier cache's ``max_kv_tokens``); the
        engine reads it as the context one request may use. ``batch_invariant``: compute every
        row as :mod:`ruvllm_candle_like.invariant` does (the caller has checked the kernels);
        ``rows_check``: offer to compute so only the entries marked ``invariant`` (a request's own
        ``batch_invariant``), in a pass of their own beside the step's other rows, once this
        check of the machine's kernels (why not, or None) passes; run at the first request that
        asks, since it takes seconds and most engines never need it. ``compile_decode``: run
        small decode-only steps as a compiled graph (:mod:`ruvllm_candle_like.decode_graph`),
        compiled here (16-bit pool, int4 layers; otherwise logged and eager)."""
        if block_size < 1:
            raise InvalidRequest("block_size", f"must be >= 1; got {block_size}")
        if max_sequences < 1:
            raise InvalidRequest("max_sequences", f"must be >= 1; got {max_sequences}")
        #: The model on the mode's kernels (shares the weights), for the mode or marked rows.
        self._twin = invariant_twin(model) if batch_invariant or rows_check else None
        self.model = self._twin if batch_invariant else model
        self.batch_invariant = batch_invariant
        self._rows_check = None if batch_invariant else rows_check
        self._rows_ok: bool | None = None
        #: LoRA adapters by name; rows of one step are grouped per adapter (base rows: none).
        self.adapters = adapters or AdapterRegistry()
        self.block_size = block_size
        self.num_blocks = max(num_tokens // block_size, 1)
        self.max_batch_tokens = max_batch_tokens
        self.max_sequences = max_sequences
        if max_seq_len is not None and max_seq_len < 1:
            raise InvalidRequest("max_seq_len", f"must be >= 1; got {max_seq_len}")
        #: Most positions of one sequence (ExecutorCore.max_request_tokens reads it).
        self.max_seq_len = min(max_seq_len or model.max_positions, model.max_positions)
        self.kv_dtype = kv_dtype
        self.compute_dtype = model.dtype
        self.device = model.device
        cfg = model.cfg
        #: Small decode steps as one compiled graph (None: every step eager; always with two_tier).
        self.graph: DecodeGraph | None = None
        #: The two-tier store (None: the 16-bit pool in ``k``/``v``).
        self.two_tier: PagedTwoTier | None = None
        #: Per layer ``[slots, 2, Hkv, D]``: K (``[:, 0]``) and V (``[:, 1]``) of each slot.
        self.kv: list[torch.Tensor] = []
        self.native_decode_off: str | None = "the two-tier store is read through its own gather"
        #: Views of K and of V of each layer's pool.
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        if two_tier is not None:
            self.two_tier = PagedTwoTier(cfg, two_tier, num_blocks=self.num_blocks, block_size=block_size,
                                         max_sequences=max_sequences, kv_dtype=kv_dtype, device=self.device)
            return
        shape = (self.num_blocks * block_size, 2, cfg.num_kv_heads, cfg.head_dim)
        # Zeros, not empty: padded gather positions are masked out, but NaN garbage in V would
        # still poison the output (0 * NaN = NaN).
        self.kv = [zeroed_pool(shape, kv_dtype, self.device) for _ in range(cfg.num_layers)]
        #: Why decode rows attend through a gather and SDPA, or None when the native kernel reads
        #: the pool in place (paged_attention.py).
        self.native_decode_off = paged_attention.unavailable(self.kv[0], cfg.head_dim)
        #: The pools' addresses, for the native decoder (native_decoder.py).
        self.pool_pointers = (ctypes.c_void_p * len(self.kv))(*[pool.data_ptr() for pool in self.kv])
        self.k = [pool[:, 0] for pool in self.kv]
        self.v = [pool[:, 1] for pool in self.kv]
        if compile_decode and not batch_invariant:
            if (why := unsupported(model)) is not None:
                log.warning("candle_like: compile_decode has no effect: %s", why)
            else:
                # The graph traces the PyTorch plan (the kernel is a ctypes call), and every
                # step then takes that plan: a row gets the same kernels in and out of the graph.
                native_off = self.native_decode_off
                self.native_decode_off = "compile_decode's graph traces the PyTorch attention"
                self.graph = DecodeGraph(model, max_sequences)
                self.graph.warm(self._warm_step)
                if self.graph.failed is not None:  # every step runs eagerly: as without the option
                    self.native_decode_off = native_off

    @property
    def kv_cache(self) -> str:
        """``"two_tier"`` or ``"fp16"`` (the 16-bit pool, whatever its dtype)."""
        return "fp16" if self.two_tier is None else "two_tier"

    def nbytes(self) -> int:
        """Bytes of every tensor holding KV (allocated once, whatever is in use)."""
        if self.two_tier is not None:
            return self.two_tier.nbytes()
        return sum(t.numel() * t.element_size() for t in self.kv)

    def describe(self) -> str:
        """One line on the KV storage and its size, the kernels and the weights (logged at
        creation, printed by serve)."""
        tokens = self.num_blocks * self.block_size
        weights = self.model.describe_weights()
        if self.two_tier is not None:
            limit = ("" if self.max_seq_len == self.model.max_positions
                     else f", at most {self.max_seq_len} per sequence (max_kv_tokens)")
            return (f"paged KV for {tokens} tokens (kv_cache_tokens){limit}, {self.two_tier.describe()}; "
                    f"{weights}")
        dtype = str(self.kv_dtype).removeprefix("torch.")
        graph = "" if self.graph is None else f"; {self.graph.describe()}"
        attention = ("native decode attention" if self.native_decode_off is None
                     else f"decode attention through SDPA ({self.native_decode_off})")
        layers = ("native layers" if self.model.native is not None
                  else f"layers op by op on PyTorch ({self.model.native_off})")
        if self.model.int8:
            layers += ", int8 activations"
        return (f"paged KV for {tokens} tokens (kv_cache_tokens), 16-bit pool (kv_cache=fp16, {dtype}) "
                f"{self.nbytes() / MIB:.1f} MiB; {attention}; {layers}{graph}; {weights}")

    def _warm_step(self, rows: int) -> None:
        """One decode step of ``rows`` rows on the first blocks, before any request holds a
        block; the blocks are zeroed again after it."""
        # Lengths differ from the row count and from each other: equal sizes at tracing would
        # tie the dynamic dimensions together (a guard that a later step would break).
        lengths = [rows + 3 + i for i in range(rows)]
        per_seq = -(-max(lengths) // self.block_size)
        if rows * per_seq > self.num_blocks:
            raise BackendError(f"the KV pool has {self.num_blocks} blocks, warming needs {rows * per_seq}")
        tables = [tuple(range(i * per_seq, (i + 1) * per_seq)) for i in range(rows)]
        try:
            self.execute([BatchEntry(seq_id=i, tokens=(0,), start_pos=n - 1, block_table=tables[i])
                          for i, n in enumerate(lengths)])
        finally:
            for pool in self.kv:
                pool[: rows * per_seq * self.block_size] = 0

    def _slots(self, table: Sequence[int], start: int, stop: int) -> np.ndarray:
        pos = np.arange(start, stop)
        blocks = np.asarray(table, dtype=np.int64)[pos // self.block_size]
        return blocks * self.block_size + pos % self.block_size

    def _check(self, batch: Sequence[BatchEntry]) -> None:
        if not batch:
            raise InvalidRequest("batch", "must contain at least one entry")
        if len(batch) > self.max_sequences:
            raise InvalidRequest("batch", f"has {len(batch)} entries; at most {self.max_sequences}")
        total = sum(len(e.tokens) for e in batch)
        if total > self.max_batch_tokens:
            raise InvalidRequest("batch", f"has {total} tokens; at most {self.max_batch_tokens} per step")
        vocab = self.model.cfg.vocab_size
        for e in batch:
            if not e.tokens:
                raise InvalidRequest("tokens", f"sequence {e.seq_id}: an entry needs at least one token")
            end = e.start_pos + len(e.tokens)
            if end > self.max_seq_len:
                limit = ("context length" if self.max_seq_len == self.model.max_positions
                         else "most positions of one sequence (max_kv_tokens)")
                raise InvalidRequest("start_pos", f"sequence {e.seq_id}: position {end - 1} is past the "
                                     f"{limit} {self.max_seq_len}")
            if len(e.block_table) * self.block_size < end:
                raise InvalidRequest("block_table", f"sequence {e.seq_id}: {len(e.block_table)} blocks "
                                     f"cannot hold {end} positions of {self.block_size}")
            if any(not 0 <= b < self.num_blocks for b in e.block_table):
                raise InvalidRequest("block_table", f"sequence {e.seq_id}: block ids must be in "
                                     f"[0, {self.num_blocks})")
            if any(not 0 <= t < vocab for t in e.tokens):
                raise InvalidRequest("tokens", f"sequence {e.seq_id}: token ids must be in [0, {vocab})")

    def _plan(self, kv: _PoolStep | TwoTierStep,
              batch: Sequence[BatchEntry]) -> _StepAttention | _NativeStepAttention:
        """The default attention plan: on the native kernel where it reads the pool, else decode
        entries in one padded batch and prefills one by one."""
        if self.native_decode_off is None and isinstance(kv, _PoolStep):
            return _NativeStepAttention(self, kv, batch)
        dev = self.device
        decode_rows: list[int] = []
        decode_lengths: list[int] = []
        decode_entries: list[int] = []
        prefills: list[_Prefill] = []
        row = 0
        for i, e in enumerate(batch):
            n = len(e.tokens)
            if n == 1:
                decode_rows.append(row)
                decode_lengths.append(e.start_pos + 1)
                decode_entries.append(i)
            else:
                gather = torch.from_numpy(kv.gather(i)).to(dev)
                prefills.append(_Prefill(slice(row, row + n), gather, e.start_pos))
            row += n
        decode_gather = decode_valid = decode_rows_t = None
        if decode_rows:
            longest = max(decode_lengths)
            gather = np.zeros((len(decode_rows), longest), dtype=np.int64)
            for i, (entry, length) in enumerate(zip(decode_entries, decode_lengths, strict=True)):
                gather[i, :length] = kv.gather(entry)
            decode_gather = torch.from_numpy(gather).to(dev)
            if min(decode_lengths) < longest:
                lengths = torch.tensor(decode_lengths, device=dev)
                decode_valid = torch.arange(longest, device=dev)[None, :] < lengths[:, None]
            decode_rows_t = torch.tensor(decode_rows, device=dev)
        return _StepAttention(self, kv, decode_rows_t, decode_gather, decode_valid, prefills,
                              all_decode_in_order=not prefills)

    @property
    def invariant_rows(self) -> bool:
        """Entries marked ``invariant`` are honoured (ruvllm.executor.BatchEntry.invariant)."""
        if self._rows_ok is None:
            self._rows_ok = self._rows_check is not None and self._rows_check() is None
        return self._rows_ok

    @torch.inference_mode()
    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        self._check(batch)
        marked = [e.invariant for e in batch] if self._rows_ok else []
        if not any(marked):
            return self._forward(batch, invariant=self.batch_invariant)
        if all(marked):
            return self._forward(batch, invariant=True)
        # Rows that asked for the guarantee take the mode's kernels, the others the default ones:
        # two passes over the weights in this step, each on its own rows.
        rows = {flag: self._forward([e for e, m in zip(batch, marked, strict=True) if m == flag],
                                    invariant=flag) for flag in (False, True)}
        taken = {False: 0, True: 0}
        out = []
        for e, flag in zip(batch, marked, strict=True):
            n = len(e.tokens) if e.all_logits else int(e.sample)
            out.append(rows[flag][taken[flag]:taken[flag] + n])
            taken[flag] += n
        return np.concatenate(out)

    def _forward(self, batch: Sequence[BatchEntry], *, invariant: bool) -> np.ndarray:
        """One pass over ``batch``: on the mode's kernels when ``invariant``."""
        model = self._twin if invariant else self.model
        dev = self.device
        kv = _PoolStep(self, batch) if self.two_tier is None else self.two_tier.begin(batch)
        tokens: list[int] = []
        positions: list[np.ndarray] = []
        logit_rows: list[int] = []
        # Each adapter object is taken once for the whole step: a swap published meanwhile
        # reaches the next step, never half of this one.
        spans: list[tuple[int, int, LoraAdapter | None]] = []
        row = 0
        for e in batch:
            n = len(e.tokens)
            spans.append((row, n, None if e.adapter is None else self.adapters.resolve(e.adapter)))
            tokens.extend(e.tokens)
            positions.append(np.arange(e.start_pos, e.start_pos + n))
            row += n
            if e.all_logits:  # prompt logprobs: a row for every token of the entry
                logit_rows.extend(range(row - n, row))
            elif e.sample:
                logit_rows.append(row - 1)
        plan = _InvariantAttention(self, kv, batch) if invariant else self._plan(kv, batch)
        lora = LoraPlan.for_rows(spans, dev)
        if not invariant and lora is None and logit_rows and self._in_graph(kv, plan):
            tokens_t = torch.tensor(tokens, device=dev)
            positions_t = torch.from_numpy(np.concatenate(positions)).to(dev)
            x = self._graph_hidden(tokens_t, positions_t, kv, plan)  # type: ignore[arg-type]
            return model.logits(x, torch.tensor(logit_rows, device=dev)).cpu().numpy()
        if not logit_rows:
            # Nothing to sample (e.g. only non-final prefill chunks): run for the KV only.
            at = torch.from_numpy(np.concatenate(positions)).to(dev)
            model.forward(torch.tensor(tokens, device=dev), at, plan, torch.tensor([0], device=dev), lora)
            kv.finish()
            return np.zeros((0, model.cfg.vocab_size), dtype=np.float32)
        try:
            logits = model.forward(
                torch.tensor(tokens, device=dev), torch.from_numpy(np.concatenate(positions)).to(dev),
                plan, torch.tensor(logit_rows, device=dev), lora,
            )
        except RuntimeError as exc:
            raise BackendError(f"candle_like batched forward failed: {exc}") from exc
        kv.finish()
        return logits.cpu().numpy()

    def _in_graph(self, kv: _PoolStep | TwoTierStep, plan: _StepAttention | _InvariantAttention) -> bool:
        """A step the compiled graph covers: decode entries only, on the 16-bit pool."""
        return (self.graph is not None and isinstance(kv, _PoolStep) and isinstance(plan, _StepAttention)
                and plan.decode_gather is not None and not plan.prefills
                and self.graph.covers(*plan.decode_gather.shape))

    def _graph_hidden(self, tokens: torch.Tensor, positions: torch.Tensor, kv: _PoolStep,
                      plan: _StepAttention) -> torch.Tensor:
        assert self.graph is not None and plan.decode_gather is not None
        rows, longest = plan.decode_gather.shape
        if plan.decode_valid is None and rows > 1:
            # Every multi-row step with a mask (all true here): one graph, not a second one for
            # equal lengths (masked-out keys add exact zeros, so an all-true mask changes nothing).
            plan.decode_valid = torch.ones((rows, longest), dtype=torch.bool, device=self.device)
        dynamic = [(tokens, (0,)), (positions, (0,)), (kv.slots, (0,)), (plan.decode_gather, (0, 1))]
        if plan.decode_valid is not None:
            dynamic.append((plan.decode_valid, (0, 1)))
        return self.graph.hidden(tokens, positions, plan, dynamic)

    def free(self, seq_id: int) -> None:
        """Nothing to release: a sequence's KV lives in blocks the engine owns and reuses (the
        two-tier cache's hot slots too: a freed block may stay cached as a prefix, so its slot
        is reclaimed, least recently used first, when another block needs one)."""
        return None

    def copy_prefix(self, src_seq_id: int, dst_seq_id: int, num_tokens: int) -> None:
        raise BackendError(
            "candle_like's executor uses the paged layout: share a prefix by sharing its blocks "
            "(and copy_blocks for copy-on-write), not copy_prefix"
        )

    def trim(self, seq_id: int, num_tokens: int) -> None:
        raise BackendError("candle_like's executor uses the paged layout: the engine frees blocks, "
                           "there is no per-sequence KV to trim")

    @torch.inference_mode()
    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        if not pairs:
            return
        for s, d in pairs:
            if not (0 <= s < self.num_blocks and 0 <= d < self.num_blocks):
                raise InvalidRequest("pairs", f"block ids must be in [0, {self.num_blocks}); got ({s}, {d})")
        if self.two_tier is not None:
            self.two_tier.copy_blocks(pairs)
            return
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        for pool in self.kv:
            view = pool.view(self.num_blocks, self.block_size, *pool.shape[1:])
            view[dst] = view[src]
