"""Batch-invariant numerics (``[engine] batch_invariant``): a row's logits are a function of its
own token, its position and its past K/V, never of what else shares the step.

What breaks it in the default path, measured on the 2-core AVX2 kind (float32, torch 2.13; the
figures are in docs/engine.md, "Batch-invariant mode"):

- oneDNN's linear computes a lone row (M = 1, a GEMV kernel) with other bits than the same row
  among M >= 2, and gives one set of bits for every M >= 2: a solo decode step differs from a
  batched one in every projection and in the head;
- MKL's matmul (attention's QK^T and PV, K = 64) computes rows in blocks of four: M = 1 and
  M = 2-3 give a row other bits than M >= 4, and so do the rows of a partial last block
  (rows 8-9 of a 10-row product);
- ``scaled_dot_product_attention`` splits queries and keys into blocks sized by the lengths, and
  a padded decode batch attends over the longest sequence's length: a query's reduction order
  depends on its neighbours.

RMSNorm, softmax over the last dimension, SiLU and the element-wise ops gave the same bits at
every row count (and softmax the same with trailing masked entries), so they run as they are.

So here every matmul runs on a whole number of :data:`ROW_BLOCK` rows (zero rows added) and
attention runs over a fixed split of the keys: one QK^T over the keys padded to whole tiles of
:data:`KV_TILE` positions, a softmax over that row (masked keys add exact zeros), and PV summed
tile by tile in position order (a tile beyond a query's position adds an exact zero). A query at
position ``p`` then meets the same kernels on the same inputs whether it is decoded alone, beside
fifteen others, or recomputed inside a prefill chunk after preemption; by induction every K/V a
position writes is the same bits too, so prefix-cache hits and chunk boundaries change nothing.

:func:`check_kernels` samples these properties on the running machine before the mode is used
(each projection kind at several row counts, a query in each of its three schedules): another
CPU or torch build may block its kernels otherwise, and then the mode is refused by name rather
than promised.
"""

from __future__ import annotations

import copy
import math

import torch

from ruvllm_candle_like.model import Layer, Transformer
from ruvllm_candle_like.projection import PROJECTIONS, BlockProjection
from ruvllm_candle_like.weights import AnyProjection

#: Every matmul of the mode runs on a multiple of this many rows: MKL's K = 64 matmul blocks rows
#: by four, oneDNN's linear is row-count invariant from two rows on.
ROW_BLOCK = 4
#: Keys per attention tile: PV is accumulated one tile at a time, in position order. Small, so
#: a sequence's keys are padded by at most 63 (the gather and the products over padding are most
#: of the mode's cost at short contexts); one batched matmul computes every tile's product.
KV_TILE = 64


def whole_blocks(rows: int) -> int:
    """``rows`` rounded up to a multiple of :data:`ROW_BLOCK`."""
    return -(-rows // ROW_BLOCK) * ROW_BLOCK


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` with zero rows appended up to whole :data:`ROW_BLOCK` s (``x`` itself when it has them)."""
    n = x.shape[0]
    rows = whole_blocks(n)
    return x if rows == n else torch.cat([x, x.new_zeros((rows - n, *x.shape[1:]))])


class PaddedProjection:
    """A projection that runs on whole :data:`ROW_BLOCK` s of rows.

    An int4 projection runs int4 at every row count here (its dense copy, taken from some row
    count on, would give a row other bits in a larger step)."""

    __slots__ = ("bias", "inner")

    def __init__(self, inner: AnyProjection):
        self.inner = inner.kernel_only() if isinstance(inner, BlockProjection) else inner
        self.bias = inner.bias

    @property
    def weight(self) -> torch.Tensor:
        """The inner projection's (LoRA and writers read it, as on a plain Projection)."""
        return self.inner.weight

    @property
    def shape(self) -> torch.Size:
        return self.inner.shape

    @property
    def held(self) -> str:
        return self.inner.held

    def nbytes(self) -> int:
        return self.inner.nbytes()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[0]
        return self.inner(x) if n % ROW_BLOCK == 0 else self.inner(pad_rows(x))[:n]


def invariant_twin(model: Transformer) -> Transformer:
    """A copy of ``model`` sharing its weights whose projections and head pad lone rows."""
    twin = copy.copy(model)
    # The mode keeps its own kernels, those its tests pin, on every CPU.
    twin.native, twin.native_off = None, "the batch-invariant mode's own kernels"
    twin.lm_head = PaddedProjection(model.lm_head)  # type: ignore[assignment]
    twin.layers = []
    for layer in model.layers:
        new = Layer()
        new.ln1, new.ln2 = layer.ln1, layer.ln2
        for name in PROJECTIONS:
            setattr(new, name, PaddedProjection(getattr(layer, name)))
        twin.layers.append(new)
    return twin


def tiled_length(length: int) -> int:
    """``length`` keys rounded up to whole tiles."""
    return -(-length // KV_TILE) * KV_TILE


def attend_tiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """``q`` [B, Hkv, R, D] (R whole row blocks), ``k``/``v`` [B, Hkv, L, D] with L whole tiles,
    ``hidden`` bool [B, 1, R, L], True where a row may not see a key (every row sees key 0)
    -> [B, Hkv, R, D].

    A row's bits depend on its query, its visible keys and the tiles only: the softmax is over
    the row (masked keys are exact zeros), PV is one product per tile, all tiles in one batched
    matmul, and the tiles' products are added one after another in position order (a tile past
    the row's position adds an exact zero, so a longer neighbour's tiles change nothing)."""
    # Contiguous operands: a view's strides could send the same rows to another GEMM variant.
    q = (q * (1.0 / math.sqrt(q.shape[-1]))).contiguous()
    scores = torch.matmul(q, k.contiguous().transpose(-1, -2))
    probs = torch.softmax(scores.masked_fill_(hidden, float("-inf")), dim=-1)
    *lead, rows, length = probs.shape
    tiles = length // KV_TILE
    per_tile = torch.matmul(probs.view(*lead, rows, tiles, KV_TILE).transpose(-3, -2).contiguous(),
                            v.contiguous().view(*lead, tiles, KV_TILE, v.shape[-1]))
    out = per_tile[..., 0, :, :]
    for tile in range(1, tiles):
        out = out + per_tile[..., tile, :, :]
    return out


def hidden_keys(positions: torch.Tensor, length: int) -> torch.Tensor:
    """Bool [R, length]: row ``r`` (a query at ``positions[r]``) may not see keys past positions[r]."""
    return torch.arange(length, device=positions.device)[None, :] > positions[:, None]


def check_kernels(model: Transformer) -> str | None:
    """Why the mode cannot hold with this machine's kernels, or None when it can.

    Runs the properties the mode rests on, on the model's dtype and device: each projection kind
    and the head give a row the same bits at every row count, and :func:`attend_tiled` gives a
    query the same bits alone, inside a prefill chunk and beside longer sequences."""
    gen = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(device=model.device, dtype=model.dtype)

    layer = model.layers[0]
    for name, proj in (("qkv", layer.qkv), ("down", layer.down), ("output", model.lm_head)):
        padded = PaddedProjection(proj)
        x = rand(17, proj.shape[1])
        alone = torch.cat([padded(x[i:i + 1]) for i in range(17)])
        for rows in (2, 5, 17):
            if not torch.equal(padded(x[:rows]), alone[:rows]):
                return f"the {name} projection computes a row with other bits among {rows} rows"
    d, pos = model.cfg.head_dim, 200
    q, k, v = rand(d), rand(600, d), rand(600, d)

    def attend(queries: torch.Tensor, positions: list[int], lengths: list[int]) -> torch.Tensor:
        length = tiled_length(max(lengths))
        keys = torch.stack([torch.cat([k[:n], rand(length - n, d)]) for n in lengths])[:, None]
        values = torch.stack([torch.cat([v[:n], rand(length - n, d)]) for n in lengths])[:, None]
        hidden = hidden_keys(torch.tensor(positions * len(lengths)), length).view(
            len(lengths), 1, len(positions), length)
        return attend_tiled(queries, keys, values, hidden)

    alone = attend(pad_rows(q[None])[None, None], [pos] + [0] * (ROW_BLOCK - 1), [pos + 1])[0, 0, 0]
    # The query as row 8 of 9: a partial row block unless padded.
    chunk = attend(pad_rows(torch.cat([rand(8, d), q[None]]))[None, None],
                   list(range(pos - 8, pos + 1)) + [0] * (whole_blocks(9) - 9), [pos + 1])
    beside = attend(torch.stack([pad_rows(torch.cat([q[None], rand(1, d)]))] * 3)[:, None],
                    [pos, 599] + [0] * (ROW_BLOCK - 2), [pos + 1, 600, 300])
    if not (torch.equal(chunk[0, 0, 8], alone) and torch.equal(beside[0, 0, 0], alone)):
        return "attention computes a query with other bits inside a prefill chunk or beside longer sequences"
    return None
