"""Cached prefixes kept in host memory, out of the llama.cpp KV pool ("parked").

A finished request kept in the pool for its cached prefix (a *donor*, ruvllm.engine.slots) costs
later requests. Without flash attention, llama.cpp computes every token's attention over all
cells in use up to the highest one (masked per sequence), so every later step attends over the
donor's cells too: measured with two such donors of about 430 tokens, one request decoded 28-30
tokens/s instead of 44.7 on an otherwise empty pool (docs/engine.md, "Parked prefixes"). And
attention sums by cell position, with or without flash attention, so the cells donors hold
decide where a later request lands and so its logits: with donors in the pool, the same greedy
request sent again after other traffic moved by 0.58-1.45 (tests/engine/test_engine_llamacpp.py
has the case); with donors parked an idle pool is empty and the repeat is bit-identical. So the
executor copies a donor's cells to host memory (``llama_state_seq_get_data``) and frees them
from the pool; a request that hits the prefix gets exactly those bytes back
(``llama_state_seq_set_data``), cut to the positions it needs, so the KV it attends to is the KV
a prefill computed.

The bytes are llama.cpp's per-sequence state (``llama_context::state_seq_get_data`` and
``llama_kv_cache::state_write`` in src/): a magic number and the sequence id, one stream's cell
count, each cell's position and sequence, then per layer the K rows and the V rows (or, with V
transposed when flash attention is off, each V channel across the cells). :func:`truncate`
keeps the cells below a position, which serves a hit on part of a prefix without restoring more
cells than the engine accounted for; :func:`select` keeps a range of positions in position order,
which the batch-invariant mode's compaction restores (ruvllm_llamacpp.cell_order).
"""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import Any

import attrs
import numpy as np
from ruvllm.errors import BackendError

_U32 = np.dtype("<u4")
#: ``io_magic`` in src/llama-context.cpp: the first four bytes of a sequence state.
STATE_MAGIC = 0xAF143CD8


@attrs.frozen
class ParkedPrefix:
    """A donor's first ``num_tokens`` positions, as llama.cpp's state bytes."""

    data: bytes
    num_tokens: int


def save_sequence(lib: ModuleType, ctx: Any, seq_id: int) -> bytes | None:
    """``seq_id``'s state bytes (``llama_state_seq_get_data``), or None when llama.cpp wrote
    fewer bytes than it said it would."""
    size = lib.llama_state_seq_get_size(ctx, seq_id)
    buf = (ctypes.c_uint8 * size)()
    return bytes(buf) if lib.llama_state_seq_get_data(ctx, buf, size, seq_id) == size else None


def restore_sequence(lib: ModuleType, ctx: Any, seq_id: int, data: bytes) -> bool:
    """``data`` (a sequence's state bytes) restored into ``seq_id``'s cells; False when llama.cpp
    took fewer bytes (no free cells for them)."""
    buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    return lib.llama_state_seq_set_data(ctx, buf, len(data), seq_id) == len(data)


class _Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.at = 0

    def take(self, n: int) -> bytes:
        if self.at + n > len(self.data):
            raise BackendError("a parked KV prefix is shorter than its header says "
                               "(llama.cpp's sequence state format changed?)")
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def u32(self) -> int:
        return int.from_bytes(self.take(4), "little")

    def u64(self) -> int:
        return int.from_bytes(self.take(8), "little")


def truncate(data: bytes, num_tokens: int) -> bytes:
    """``data`` (one sequence's llama.cpp state) with only the cells at positions below
    ``num_tokens``; raises BackendError on a layout this reader does not know (several streams,
    cells with extra data), so a format change fails loudly instead of restoring garbage."""
    return select(data, 0, num_tokens)


def select(data: bytes, start: int, stop: int | None = None) -> bytes:
    """``data`` (one sequence's llama.cpp state) with only the cells at positions in
    ``[start, stop)`` (``stop`` None: to the end), in position order: restored, they take
    consecutive cells in that order whatever order the pool held them in."""
    r = _Reader(data)
    if r.u32() != STATE_MAGIC:
        raise BackendError("a parked KV prefix does not start with llama.cpp's sequence state magic")
    head = data[:8]  # the magic and the sequence id
    r.take(4)
    if r.u32() != 1:
        raise BackendError("a parked KV prefix holds several streams; the pool is one unified stream")
    n_cells = r.u32()
    if n_cells == 0:
        return data
    empty = head + (1).to_bytes(4, "little") + (0).to_bytes(4, "little")
    meta_row = 12  # pos (i32), n_seq_id (u32) = 1, seq_id (i32)
    meta = np.frombuffer(r.take(n_cells * meta_row), dtype=_U32).reshape(n_cells, 3)
    if n_cells and not (meta[:, 1] == 1).all():
        raise BackendError("a parked KV prefix has cells with extra data (M-RoPE or per-token "
                           "state); parking is for plain text models")
    pos = meta[:, 0].view(np.int32)
    inside = (pos >= start) & (pos < stop) if stop is not None else pos >= start
    keep = np.flatnonzero(inside)
    keep = keep[np.argsort(pos[keep], kind="stable")]
    n_keep = len(keep)
    if n_keep == 0:
        return empty
    out = [head, (1).to_bytes(4, "little"), n_keep.to_bytes(4, "little"), meta[keep].tobytes()]
    v_trans, n_layer = r.u32(), r.u32()
    out += [v_trans.to_bytes(4, "little"), n_layer.to_bytes(4, "little")]
    for tensor in ("K", "V"):
        for _ in range(n_layer):
            out.append(r.take(4))  # the cell type
            if tensor == "K" or not v_trans:
                row = r.u64()
                rows = np.frombuffer(r.take(n_cells * row), dtype=np.uint8).reshape(n_cells, row)
                out += [row.to_bytes(8, "little"), rows[keep].tobytes()]
            else:  # V transposed: each channel holds one element per cell
                el, channels = r.u32(), r.u32()
                cols = np.frombuffer(r.take(channels * n_cells * el), dtype=np.uint8)
                cols = cols.reshape(channels, n_cells, el)
                out += [el.to_bytes(4, "little"), channels.to_bytes(4, "little"), cols[:, keep].tobytes()]
    if r.at != len(data):
        raise BackendError(f"a parked KV prefix has {len(data) - r.at} bytes past its layers "
                           "(llama.cpp's sequence state format changed?)")
    return b"".join(out)
