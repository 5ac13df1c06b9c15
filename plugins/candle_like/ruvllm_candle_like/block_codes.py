"""A GGUF tensor's blocks as the codes ruvllm's kernels run: ``w = code * scale + offset`` per
group of 32 inputs, llama.cpp's own form.

Most of llama.cpp's types map onto one of two code widths without changing a weight (``code *
scale`` is exact in float32 for each, so the one rounding left is the one llama.cpp's
dequantisation makes, and the weights are its bits):

- 4 bits, codes 0..15: Q4_1 (``scale = d``, ``offset = m``), Q4_0 (``d``, ``-8 d``) and Q4_K,
  whose super-blocks are 8 groups of 32 with 6-bit scales and mins under ``d``/``dmin``
  (``d sc``, ``-dmin mn``);
- 5 bits, codes 0..31: Q5_0 (``d``, ``-16 d``), Q5_1 (``d``, ``m``) and Q5_K (Q4_K's groups with
  a fifth bit);
- 8 bits, signed codes: Q8_0 (``q``, ``d``, 0).

Q6_K is the one common type that does not fit: its groups of 16 carry their own 8-bit scales,
which one scale per 32 cannot hold. Its weights are re-quantised per group of 32 to 8 bits as
llama.cpp's Q8_0 quantiser does (``d = max|w| / 127`` in float16, codes ``round(w / d)``): at most
``d / 2`` from the stored weight (0.54 % relative RMS error on a Q4_K_M file's Q6_K tensors,
docs/backends/candle_like.md), and said once in the log. Dense rather than re-quantised
would cost 4 bytes a weight instead of 1.1 on every step's reads. Other types (Q2_K, Q3_K, the
IQ types) have no mapping: their projections run dense, exactly dequantised, after a log line.

A fused matrix (q/k/v, gate/up) whose parts have several widths takes the widest for every part
(a 4-bit code is the same 5-bit or 8-bit code): one kernel call, the same weights.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np
from ruvllm.errors import ModelLoadError

from ruvllm_candle_like.auto_claim import REQUANTISED_TYPES
from ruvllm_candle_like.cpu_dtype import warn_once

#: Inputs per scale/offset pair: llama.cpp's block size and the kernels' group size.
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
class KFactors:
    """The K-quants' scales and offsets as the file keeps them: per super-block of 8 groups a
    float16 ``d`` and ``-dmin`` ``[rows, groups / 8]``, per group 6-bit ``sc`` and ``mn`` ``[rows,
    groups]``; ``scale = d sc`` and ``offset = -dmin mn``, each product exact in float32. The
    kernels multiply them as they load them: 2.5 bytes a group where float32 products take 8."""

    d: np.ndarray
    sc: np.ndarray
    neg_dmin: np.ndarray
    mn: np.ndarray


def _concat_factors(parts: Sequence[KFactors | None]) -> KFactors | None:
    if any(p is None for p in parts):
        return None
    return KFactors(*(np.concatenate([getattr(p, f) for p in parts]) for f in ("d", "sc", "neg_dmin", "mn")))


@attrs.frozen(eq=False)
class BlockCodes:
    """Codes ``[rows, cols]`` with float32 ``scale`` and ``offset`` ``[rows, cols / 32]``:
    ``w = code * scale + offset``. 4 and 5 bits: uint8 codes 0..15 or 0..31; 8 bits: int8 codes,
    and where a group has a negative code its offset is zero (the kernels' int8 layout relies on
    it)."""

    codes: np.ndarray
    scale: np.ndarray
    offset: np.ndarray
    bits: int
    #: The K-quants' factors of ``scale`` and ``offset`` (None for other types).
    factors: KFactors | None = None

    @property
    def shape(self) -> tuple[int, int]:
        return self.codes.shape  # type: ignore[return-value]

    @property
    def zero(self) -> np.ndarray:
        """torch's int4 kernel's zero point: ``w = (code - 8) * scale + zero``."""
        return (self.offset + np.float32(8) * self.scale).astype(np.float32)

    def dequantize(self) -> np.ndarray:
        """The float32 weights the codes stand for (each product exact, one rounding in the sum)."""
        rows, cols = self.shape
        q = self.codes.reshape(rows, cols // GROUP, GROUP).astype(np.float32)
        return (q * self.scale[..., None] + self.offset[..., None]).reshape(rows, cols)

    def widened(self, bits: int) -> BlockCodes:
        """The same weights as codes of ``bits`` (at least this width)."""
        if bits == self.bits:
            return self
        return attrs.evolve(self, codes=self.codes.astype(np.int8 if bits == 8 else np.uint8), bits=bits)


def concat(parts: Sequence[BlockCodes]) -> BlockCodes:
    """The codes of the row-wise concatenation (the fused q/k/v and gate/up matrices), in the
    widest of the parts' widths."""
    bits = max(p.bits for p in parts)
    parts = [p.widened(bits) for p in parts]
    return BlockCodes(codes=np.concatenate([p.codes for p in parts]),
                      scale=np.concatenate([p.scale for p in parts]),
                      offset=np.concatenate([p.offset for p in parts]), bits=parts[0].bits,
                      factors=_concat_factors([p.factors for p in parts]))


def block_codes(blocks: GgufBlocks) -> BlockCodes | None:
    """The tensor as codes (Q6_K re-quantised), or None for a type this module does not map."""
    reader = _READERS.get(blocks.type_name)
    return None if reader is None else reader(blocks)


def codes_or_log(name: str, blocks: GgufBlocks) -> BlockCodes | None:
    """:func:`block_codes`, saying once per type and process what is re-quantised or runs dense."""
    codes = block_codes(blocks)
    if codes is None:
        warn_once(f"codes {blocks.type_name}", "candle_like: %s weights (first: %s) have no block-kernel "
                  "mapping; their projections run dense", blocks.type_name, name)
    elif blocks.type_name in REQUANTISED_TYPES:
        warn_once(f"codes {blocks.type_name}", "candle_like: %s weights (first: %s) run re-quantised to "
                  "8 bits per group of 32 (each within half a step, 1/127 of its group's largest weight)",
                  blocks.type_name, name)
    return codes


def _f16(b: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte ``at`` of each block, as float32."""
    return np.ascontiguousarray(b[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _from_q4(blocks: GgufBlocks) -> BlockCodes:
    rows, cols = blocks.shape
    has_min = blocks.type_name == "Q4_1"
    head = 4 if has_min else 2
    b = blocks.raw.reshape(rows, cols // GROUP, head + GROUP // 2)
    d = _f16(b, 0)
    qs = b[..., head:]
    # Element j of a block is the low nibble of byte j, element j + 16 its high nibble.
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).reshape(rows, cols)
    offset = _f16(b, 2) if has_min else np.float32(-8) * d
    return BlockCodes(codes=codes, scale=d, offset=offset, bits=4)


def _from_q4_k(blocks: GgufBlocks) -> BlockCodes:
    rows, cols = blocks.shape
    b = blocks.raw.reshape(-1, 144)  # d, dmin (f16), 12 bytes of 6-bit scales/mins, 128 of codes
    # Group 2j holds the low nibbles of code bytes 32j..32j+31, group 2j+1 their high nibbles.
    qs = b[:, 16:].reshape(-1, 4, 1, GROUP)
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(rows, cols)
    return _k_codes(codes, b, rows, bits=4)


def _from_q5_k(blocks: GgufBlocks) -> BlockCodes:
    rows, cols = blocks.shape
    b = blocks.raw.reshape(-1, 176)  # as Q4_K, then 32 bytes of fifth bits, then 128 of nibbles
    qh = b[:, 16:48].reshape(-1, 1, GROUP) >> np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
    qs = b[:, 48:].reshape(-1, 4, 1, GROUP)
    low = np.concatenate([qs & 0x0F, qs >> 4], axis=2).reshape(-1, 8, GROUP)
    # Group g's fifth bits are bit g of the 32 high bytes.
    codes = (low | ((qh & 1) << 4)).reshape(rows, cols)
    return _k_codes(codes, b, rows, bits=5)


def _k_codes(codes: np.ndarray, b: np.ndarray, rows: int, *, bits: int) -> BlockCodes:
    """Q4_K/Q5_K codes with their super-blocks' per-group ``d sc`` and ``-dmin mn``."""
    from gguf.quants import Q4_K

    sc, mn = Q4_K.get_scale_min(b[:, 4:16])
    d = np.ascontiguousarray(b[:, 0:2]).view(np.float16)[:, 0]
    neg_dmin = -np.ascontiguousarray(b[:, 2:4]).view(np.float16)[:, 0]
    factors = KFactors(d=d.reshape(rows, -1), sc=sc.astype(np.uint8).reshape(rows, -1),
                       neg_dmin=neg_dmin.reshape(rows, -1), mn=mn.astype(np.uint8).reshape(rows, -1))
    scale = d.astype(np.float32)[:, None] * sc.astype(np.float32)
    offset = neg_dmin.astype(np.float32)[:, None] * mn.astype(np.float32)
    return BlockCodes(codes=codes, scale=scale.reshape(rows, -1), offset=offset.reshape(rows, -1), bits=bits,
                      factors=factors)


def _from_q5(blocks: GgufBlocks) -> BlockCodes:
    rows, cols = blocks.shape
    has_min = blocks.type_name == "Q5_1"
    head = 4 if has_min else 2
    b = blocks.raw.reshape(rows, cols // GROUP, head + 4 + GROUP // 2)
    d = _f16(b, 0)
    qh = np.ascontiguousarray(b[..., head:head + 4]).view(np.uint32)  # bit j: element j's fifth bit
    high = ((qh >> np.arange(GROUP, dtype=np.uint32)) & 1).astype(np.uint8) << 4
    qs = b[..., head + 4:]
    codes = (np.concatenate([qs & 0x0F, qs >> 4], axis=-1) | high).reshape(rows, cols)
    offset = _f16(b, 2) if has_min else np.float32(-16) * d
    return BlockCodes(codes=codes, scale=d, offset=offset, bits=5)


def _from_q8_0(blocks: GgufBlocks) -> BlockCodes:
    rows, cols = blocks.shape
    b = blocks.raw.reshape(rows, cols // GROUP, 2 + GROUP)
    d = _f16(b, 0)
    codes = np.ascontiguousarray(b[..., 2:]).view(np.int8).reshape(rows, cols)
    return BlockCodes(codes=codes, scale=d, offset=np.zeros_like(d), bits=8)


def _requantised(blocks: GgufBlocks) -> BlockCodes:
    """llama.cpp's Q8_0 quantisation of the stored weights, its scale rounded to float16 first
    so that every code is within half a step of its weight."""
    rows, cols = blocks.shape
    w = blocks.dequantize().reshape(rows, cols // GROUP, GROUP)
    d = (np.abs(w).max(axis=-1) / np.float32(127)).astype(np.float16).astype(np.float32)
    # A group whose scale rounds to 0 in float16 (every weight under ~4e-6) becomes zeros.
    safe = np.where(d == 0, np.float32(np.inf), d)
    codes = np.clip(np.rint(w / safe[..., None]), -127, 127).astype(np.int8)
    return BlockCodes(codes=codes.reshape(rows, cols), scale=d, offset=np.zeros_like(d), bits=8)


_READERS = {"Q4_0": _from_q4, "Q4_1": _from_q4, "Q4_K": _from_q4_k, "Q5_0": _from_q5, "Q5_1": _from_q5,
            "Q5_K": _from_q5_k, "Q8_0": _from_q8_0, "Q6_K": _requantised}
