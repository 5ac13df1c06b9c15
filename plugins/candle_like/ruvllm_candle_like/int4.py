"""GGUF 4-bit blocks as int4 codes, and torch's packed int4 weights (``aten._weight_int4pack_mm_for_cpu``).

:class:`Int4Codes` keeps llama.cpp's own form, ``w = code * scale + offset`` per group of 32
inputs; ruvllm's block kernel (blockmm.py) computes with exactly that, and torch's kernel, the
fallback where ruvllm's cannot run, with ``w = (code - 8) * scale + zero`` (``zero = offset +
8 scale``, its scales and zeros ``[K / 32, N, 2]``, checked against its output in
tests/candle_like/test_int4.py):

- Q4_1 (``w = q * d + m``): ``scale = d``, ``offset = m``;
- Q4_0 (``w = (q - 8) * d``): ``scale = d``, ``offset = -8 d``.

``q * d`` is exact in float32 (a 4-bit code times an f16 scale), so one rounding remains, as in
llama.cpp's dequantisation: the codes give its weights bit for bit on every tensor of the
embedded model. torch's kernel's only vectorised path in torch 2.13 (AVX2 and AVX-512) takes
bfloat16 activations, scales and zeros: float32 or float16 activations run a scalar loop 10-40x
slower. So its packed weights carry bfloat16 scales and zeros, and the rounding of ``d`` and
``m + 8 d`` to 8 significant bits is the one difference from llama.cpp's weights: at most
``2^-8 (8 |d| + |zero|)`` per weight.

Q4_K's super-blocks are 8 groups of 32 codes, each with a 6-bit scale ``sc`` and min ``mn`` under
the block's ``d``/``dmin`` (``w = d sc q - dmin mn``): ``scale = d sc``, ``offset = -dmin mn``,
the same codes. Other types (Q6_K's 16-element groups of 6-bit codes, Q5_*, Q8_0) return None and
stay dense; :func:`requantize` (per group of 32, round to nearest between the group's min and max)
is how their int4 error was measured (docs/backends/candle_like.md) before choosing so.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import attrs
import numpy as np
import torch
from ruvllm.errors import ModelLoadError

from ruvllm_candle_like.auto_claim import FOUR_BIT_TYPES
from ruvllm_candle_like.cpu_dtype import warn_once

#: Inputs per scale/zero pair: llama.cpp's block size and the kernel's group size.
GROUP = 32


@attrs.frozen(eq=False)
class GgufBlocks:
    """One GGUF tensor's quantised rows, unexpanded: ``raw`` is ``[rows, row bytes]``."""

    type_name: str
    type: int
    raw: np.ndarray
    shape: tuple[int, int]

    def dequantize(self) -> np.ndarray:
        """llama.cpp's float32 values (the ``gguf`` package's reference dequantisation)."""
        return dequantize(self.raw, self.type, self.type_name, self.shape)


def dequantize(raw: np.ndarray, ggml_type: int, type_name: str, shape: tuple[int, ...], *,
               source: str = "weights", tensor: str = "a tensor") -> np.ndarray:
    """A GGUF tensor's bytes as llama.cpp's float32 values of ``shape`` (the ``gguf`` package's
    reference dequantisation); a type that package cannot read is a ModelLoadError naming it."""
    import gguf

    try:
        values = gguf.quants.dequantize(raw, ggml_type)
    except NotImplementedError as exc:
        raise ModelLoadError(source, f"{tensor} uses {type_name}, which cannot be dequantised by the "
                             f"gguf package installed ({exc})") from None
    return np.asarray(values, dtype=np.float32).reshape(shape)


@attrs.frozen(eq=False)
class Int4Codes:
    """Codes 0..15 ``[rows, cols]`` with float32 ``scale`` and ``offset`` ``[rows, cols / 32]``:
    ``w = code * scale + offset``, llama.cpp's own form (Q4_1's ``d`` and ``m``)."""

    codes: np.ndarray
    scale: np.ndarray
    offset: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape  # type: ignore[return-value]

    @property
    def zero(self) -> np.ndarray:
        """torch's kernel's zero point: ``w = (code - 8) * scale + zero``."""
        return (self.offset + np.float32(8) * self.scale).astype(np.float32)

    def dequantize(self) -> np.ndarray:
        """The float32 weights the codes stand for (each product exact, one rounding in the sum)."""
        rows, cols = self.shape
        q = self.codes.reshape(rows, cols // GROUP, GROUP).astype(np.float32)
        return (q * self.scale[..., None] + self.offset[..., None]).reshape(rows, cols)


def concat(parts: Sequence[Int4Codes]) -> Int4Codes:
    """The codes of the row-wise concatenation (the fused q/k/v and gate/up matrices)."""
    return Int4Codes(codes=np.concatenate([p.codes for p in parts]),
                     scale=np.concatenate([p.scale for p in parts]),
                     offset=np.concatenate([p.offset for p in parts]))


def int4_codes(blocks: GgufBlocks) -> Int4Codes | None:
    """The tensor as int4 codes, or None for a type this module does not map."""
    if blocks.type_name == "Q4_K":
        return _from_q4_k(blocks)
    if blocks.type_name in FOUR_BIT_TYPES:
        return _from_q4(blocks)
    return None


def codes_or_log(name: str, blocks: GgufBlocks) -> Int4Codes | None:
    """:func:`int4_codes`, saying once per type and process what runs dense or re-quantised."""
    codes = int4_codes(blocks)
    if codes is None:
        warn_once(f"int4 {blocks.type_name}", "candle_like: %s weights (first: %s) have no int4 mapping; "
                  "their projections run dense", blocks.type_name, name)
    return codes


def _from_q4(blocks: GgufBlocks) -> Int4Codes:
    rows, cols = blocks.shape
    has_min = blocks.type_name == "Q4_1"
    head = 4 if has_min else 2
    b = blocks.raw.reshape(rows, cols // GROUP, head + GROUP // 2)
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0].astype(np.float32)
    qs = b[..., head:]
    # Element j of a block is the low nibble of byte j, element j + 16 its high nibble.
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
    if has_min:
        offset = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0].astype(np.float32)
    else:
        offset = np.float32(-8) * d
    return Int4Codes(codes=codes, scale=d, offset=offset)


def _from_q4_k(blocks: GgufBlocks) -> Int4Codes:
    from gguf.quants import Q4_K

    rows, cols = blocks.shape
    b = blocks.raw.reshape(-1, 144)  # d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 of codes
    d = np.ascontiguousarray(b[:, 0:2]).view(np.float16).astype(np.float32)
    dmin = np.ascontiguousarray(b[:, 2:4]).view(np.float16).astype(np.float32)
    sc, mn = Q4_K.get_scale_min(b[:, 4:16])
    scale = d * sc.astype(np.float32)
    # Group 2j holds the low nibbles of code bytes 32j..32j+31, group 2j+1 their high nibbles.
    qs = b[:, 16:].reshape(-1, 4, 1, GROUP)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(rows, cols)
    offset = -dmin * mn.astype(np.float32)
    return Int4Codes(codes=codes, scale=scale.reshape(rows, -1), offset=offset.reshape(rows, -1))


def requantize(w: np.ndarray) -> Int4Codes:
    """Round-to-nearest asymmetric int4 per group of 32 between the group's min and max."""
    rows, cols = w.shape
    g = w.reshape(rows, cols // GROUP, GROUP)
    lo, hi = g.min(axis=-1), g.max(axis=-1)
    scale = ((hi - lo) / np.float32(15)).astype(np.float32)
    safe = np.where(scale == 0, np.float32(1), scale)
    codes = np.clip(np.rint((g - lo[..., None]) / safe[..., None]), 0, 15).astype(np.uint8)
    return Int4Codes(codes=codes.reshape(rows, cols), scale=scale, offset=lo.astype(np.float32))


@attrs.frozen(eq=False)
class PackedInt4:
    """Codes in the kernel's packed layout (``[N, K / 2]`` bytes, CPU-specific) with bfloat16
    ``[K / 32, N, 2]`` scales and zeros."""

    packed: torch.Tensor
    scales_zeros: torch.Tensor

    @classmethod
    def pack(cls, codes: Int4Codes) -> PackedInt4:
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(
            torch.from_numpy(codes.codes.astype(np.int32)), 1)
        sz = np.stack([codes.scale.T, codes.zero.T], axis=-1)
        return cls(packed=packed, scales_zeros=torch.from_numpy(np.ascontiguousarray(sz)).to(torch.bfloat16))

    @property
    def shape(self) -> tuple[int, int]:
        """``[out, in]``."""
        return self.packed.shape[0], self.packed.shape[1] * 2

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales_zeros.nbytes

    def dequantize(self) -> torch.Tensor:
        """The float32 weights the kernel computes with (its output on an identity: exact)."""
        return self.matmul(torch.eye(self.shape[1], dtype=torch.bfloat16)).T.float()

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` in bfloat16 (float32 accumulation inside the kernel)."""
        # torch's own binding of the op: 2 us less per call than the torch.ops.aten packet, which
        # goes through Python (120 calls a decode step).
        return torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), self.packed, GROUP, self.scales_zeros)


@functools.cache
def unavailable() -> str | None:
    """Why this torch cannot run packed int4 weights, or None when it can."""
    try:
        PackedInt4.pack(requantize(np.ones((32, 64), dtype=np.float32))).matmul(torch.ones(1, 64))
    except (RuntimeError, AttributeError) as exc:
        return f"torch {torch.__version__} has no CPU int4 kernel ({str(exc).strip().splitlines()[0]})"
    return None
