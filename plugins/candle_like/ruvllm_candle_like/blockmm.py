"""Matmuls on llama.cpp's blocks of 32 as they are: ruvllm's own CPU kernel (``csrc/blockmm.cpp``).

Why a kernel of our own: torch's packed int4 matmul (``_weight_int4pack_mm_for_cpu``) takes
bfloat16 activations and dequantises its weights again for every 4 rows. On the 2-core AVX2 kind
the embedded model's 30 layers of projections took 44 ms at 16 rows on it against 24 ms here,
and at a 512-row prompt chunk 1.36 s against 0.63 s (dense float32: 0.73-0.91 s). So with this
kernel quantised weights need no dense copy for prefill: the weights stay at about the GGUF's
bytes at every row count.

- Weights are the file's own codes, scales and offsets: ``w = code * scale + offset`` in float32,
  llama.cpp's dequantisation bit for bit (:class:`~ruvllm_candle_like.block_codes.BlockCodes`:
  4-bit Q4_0, Q4_1, Q4_K; 5-bit Q5_0, Q5_1, Q5_K; 8-bit Q8_0, the embedded model's tied head; Q6_K
  re-quantised to 8 bits). Scales and offsets stay as in the file: float16 wherever float16
  holds every one exactly (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0), the K-quants' factors (``d`` per
  super-block, 6-bit ``sc`` per group) multiplied as the kernel loads them (the products need
  float32's bits, and as float32 took 8 bytes a group where the factors take 2.5): a 4-bit block
  of 32 weights is then 20 or 18.5 bytes, not 24, which the resident size and every decode
  step's reads feel.
- Activations and sums are float32: no bfloat16 rounding of the input, unlike torch's kernel.
- Each output is one chain of FMAs over the inputs in order, whatever the row count and path: a
  row's result has the same bits alone or in any batch (the batch-invariant mode relies on it).

With ``int8`` the activations are quantised to int8 per block of 32 as llama.cpp quantises them
(its Q8_1) and the products are integer dot products (``csrc/blockmm_int8.cpp``: AVX512-VNNI, or
AVX2 with the same bits): the numerics llama.cpp itself runs, 2-3x the float32 kernel's rate on
the AVX-512 kind, 1.5-2.8x on AVX2's path (options.py ``int8_activations``). The codes then take
that kernel's layout.

The kernel is built when the plugin is installed (``setup.py``, x86-64 only, optional). Where it
is missing or the CPU lacks AVX2 and FMA, :func:`unavailable` says why: ``int4_weights=auto``
then runs dense, and ``int4_weights=true`` takes torch's kernel (options.py).
"""

from __future__ import annotations

import ctypes
import functools
from typing import Any

import attrs
import numpy as np
import torch
from ruvllm.hardware import cpu_info

from ruvllm_candle_like import native
from ruvllm_candle_like.block_codes import GROUP, BlockCodes, KFactors

#: Outputs per panel of the kernel's layout.
PANEL = 16
_POINTER = ctypes.c_void_p


@functools.cache
def _kernel() -> Any:
    return native.kernel("blockmm", supported="blockmm_supported", needs="AVX2, FMA and F16C", argtypes=[
        _POINTER, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        _POINTER, _POINTER, _POINTER, _POINTER, ctypes.c_int])


@functools.cache
def _rows_kernel() -> Any:
    return native.kernel("block_rows", supported="blockmm_supported", needs="AVX2, FMA and F16C", argtypes=[
        _POINTER, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.c_int,
        _POINTER, _POINTER, _POINTER, _POINTER])


def unavailable() -> str | None:
    """Why this machine cannot run the block kernel, or None when it can."""
    fn = _kernel()
    return fn if isinstance(fn, str) else None


def int8_by_default() -> bool:
    """Whether ``int8_activations=auto`` quantises activations here: wherever the block kernel
    runs. With AVX512-VNNI they measured 2-3x the float32 kernel's rate; on AVX2's path (the same
    bits) 1.5-2.8x at 1-64 rows, and a server faster in 11 of 12 rounds of 1 and 16 clients
    (0.98-1.53x, docs/backends/candle_like.md)."""
    return unavailable() is None


#: Which int8 path the kernel takes: 1, the best this CPU has; 2, AVX2 whatever it has (the tests
#: set it to run the AVX2 path on a VNNI machine; both give the same bits).
INT8_PATH = 1


def int8_path() -> int:
    """The int8 path to ask for: :data:`INT8_PATH`, or AVX2's where ruvllm.hardware reports no
    AVX512-VNNI (``ONEDNN_MAX_CPU_ISA`` below ``AVX512_CORE_VNNI`` emulating a CPU without it)."""
    return INT8_PATH if cpu_info().has("avx512_vnni") else 2


def _run(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
         bits: int, n: int) -> torch.Tensor:
    fn = _kernel()
    assert not isinstance(fn, str), fn
    x = x.to(torch.float32).contiguous()
    rows, k = x.shape
    padded = codes.shape[0] * PANEL
    y = torch.empty(rows, padded)
    int8 = int8_path() if _int8_layout(codes) else 0
    rc = fn(x.data_ptr(), rows, k, padded, bits, scale_format(scale), int8, codes.data_ptr(),
            scale.data_ptr(), offset.data_ptr(), y.data_ptr(), torch.get_num_threads())
    if rc != 0:
        raise MemoryError(f"blockmm could not allocate its buffers for {rows} rows of {k} inputs")
    return y if padded == n else y[:, :n].contiguous()


@torch.library.custom_op("ruvllm_candle_like::blockmm", mutates_args=())
def _blockmm_op(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
                bits: int, n: int) -> torch.Tensor:
    """The kernel as an op torch.compile can call from a graph (compile_decode)."""
    return _run(x, codes, scale, offset, bits, n)


@_blockmm_op.register_fake
def _(x: torch.Tensor, codes: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor,
      bits: int, n: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], n), dtype=torch.float32)


@attrs.frozen(eq=False)
class BlockWeights:
    """One weight matrix ``[n, k]`` in the kernel's layout.

    ``codes``, float32 activations: ``[panels, k, 8]`` bytes for 4 bits (byte j: output j of the
    panel in the low nibble, output j + 8 in the high one), ``[panels, k, 10]`` for 5 bits (then
    two bytes of fifth bits, bit j output j's), ``[panels, k, 16]`` signed bytes for 8 bits; int8
    activations (``int8``): ``[panels, k / 32, chunks, 64]``, csrc/blockmm_int8.cpp's layout
    (8-bit codes there unsigned, ``q + 128``, with the offset ``-128 d``);
    ``scale`` and ``offset``: ``[panels, k / 32, 16]``, float16 when that holds all of both
    exactly, else float32; or the K-quants' factors, ``[panels, k / 256, 160]`` bytes (per
    super-block the 16 outputs' float16 factor, then 8 x 16 byte factors). Outputs past ``n``
    (padding to a whole panel) have zero weights.
    """

    codes: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor
    bits: int
    shape: tuple[int, int]

    @classmethod
    def from_codes(cls, codes: BlockCodes, *, int8: bool = False) -> BlockWeights:
        """The codes (block_codes.py) for float32 or (``int8``) int8 activations."""
        rows, cols = codes.shape
        groups = cols // GROUP
        if codes.bits != 8:
            packed = _nibbles(codes.codes, codes.bits == 5, int8)
            return cls._make(packed, codes.scale, codes.offset, codes.bits, codes.shape, codes.factors)
        if not int8:
            return cls._make(_panels(codes.codes.view(np.uint8)), codes.scale, codes.offset, 8, codes.shape)
        # vpdpbusd takes unsigned codes: a group with a negative code is stored as q + 128 with the
        # offset -128 scale (exact: such groups have a zero offset, block_codes.py).
        q = codes.codes.reshape(rows, groups, GROUP)
        signed = (q < 0).any(axis=-1)
        assert not codes.offset[signed].any(), "a group with negative codes has an offset"
        u = (q.astype(np.int16) + np.int16(128) * signed[..., None]).astype(np.uint8)
        offset = np.where(signed, np.float32(-128) * codes.scale, codes.offset)
        chunks = _padded(u.reshape(rows, cols)).reshape(-1, PANEL, groups, 8, 4).transpose(0, 2, 3, 1, 4)
        return cls._make(chunks.reshape(*chunks.shape[:3], -1), codes.scale, offset, 8, codes.shape)

    @classmethod
    def _make(cls, packed: np.ndarray, scale: np.ndarray, offset: np.ndarray, bits: int,
              shape: tuple[int, int], factors: KFactors | None = None) -> BlockWeights:
        """Scales and offsets in the smallest ScaleFormat that holds them exactly (kernels.h):
        float16, the K-quants' factors, else float32."""
        codes = torch.from_numpy(np.ascontiguousarray(packed))
        exact = all(np.array_equal(v.astype(np.float16).astype(np.float32), v.astype(np.float32))
                    for v in (scale, offset))
        if not exact and factors is not None:
            return cls(codes=codes, scale=_panel_factors(factors.d, factors.sc),
                       offset=_panel_factors(factors.neg_dmin, factors.mn), bits=bits, shape=shape)
        dtype = np.float16 if exact else np.float32
        return cls(codes=codes, scale=_panel_scales(scale, dtype), offset=_panel_scales(offset, dtype),
                   bits=bits, shape=shape)

    @property
    def nbytes(self) -> int:
        return self.codes.nbytes + self.scale.nbytes + self.offset.nbytes

    @property
    def held(self) -> str:
        return f"{self.bits}-bit blocks"

    @property
    def int8(self) -> bool:
        """True when the codes are in the int8-activation kernel's layout."""
        return _int8_layout(self.codes)

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ w.T`` in float32, for ``x`` of ``[rows, k]`` in any float dtype."""
        n = self.shape[0]
        if torch.compiler.is_compiling():
            return _blockmm_op(x, self.codes, self.scale, self.offset, self.bits, n)
        # Straight through ctypes when eager: the custom op's dispatch costs more than a small call.
        return _run(x, self.codes, self.scale, self.offset, self.bits, n)

    def dequantize(self) -> torch.Tensor:
        """The float32 weights ``[n, k]`` the codes stand for (:meth:`rows` of every output)."""
        return self.rows(torch.arange(self.shape[0]))

    def rows(self, index: torch.Tensor) -> torch.Tensor:
        """Weight rows ``index`` (int64 ``[T]``) as float32 ``[T, k]``, for an embedding table
        kept as blocks: ``code * scale + offset`` with one rounding, the kernel's FMA, as
        ``code * scale`` is exact in float32 for every GGUF type mapped here (f16 scales, Q4_K's
        ``d sc``; the int8 layout's ``(q + 128) d`` too). One native call (csrc/block_rows.cpp):
        5.2 us for one token, where a dozen torch ops took 61.5."""
        fn = _rows_kernel()
        assert not isinstance(fn, str), fn
        index = index.to(torch.int64).contiguous()
        (n, k), layout = self.shape, int(self.int8)
        out = torch.empty(len(index), k)
        rc = fn(index.data_ptr(), len(index), n, k, self.bits, scale_format(self.scale), layout,
                self.codes.data_ptr(), self.scale.data_ptr(), self.offset.data_ptr(), out.data_ptr())
        if rc == -1:
            raise IndexError(f"rows {index.tolist()} of a {n}-row matrix")
        assert rc == 0, f"block_rows knows no {self.bits}-bit codes with {self.scale.dtype} scales"
        return out


def _nibbles(codes: np.ndarray, fifth: bool, int8: bool) -> np.ndarray:
    """4-bit or (``fifth``) 5-bit codes ``[n, k]`` in the float layout (``[panels, k, 8]``, or
    ``10`` with the fifth bits) or the int8 one (``[panels, blocks, 4 or 5, 64]``,
    csrc/blockmm_int8.cpp's)."""
    groups = codes.shape[1] // GROUP
    low = codes & 0x0F
    if int8:
        # [panels, 16 outputs, blocks, half, chunk, 4]: half 0 in the low nibble, 1 in the high.
        q = _padded(low).reshape(-1, PANEL, groups, 2, 4, 4)
        packed = (q[:, :, :, 0] | (q[:, :, :, 1] << 4)).transpose(0, 2, 3, 1, 4).reshape(-1, groups, 4, 64)
        if not fifth:
            return packed
        # Per chunk, per half, 64 bits: bit 4 o + j the fifth bit of input 16 half + 4 chunk + j of output o.
        high = (_padded(codes) >> 4).reshape(-1, PANEL, groups, 2, 4, 4).transpose(0, 2, 4, 3, 1, 5)
        masks = np.packbits(high.reshape(-1, groups, 4, 2, 64), axis=-1, bitorder="little")
        return np.concatenate([packed, masks.reshape(-1, groups, 1, 64)], axis=2)
    q = _panels(low)
    packed = q[..., :PANEL // 2] | (q[..., PANEL // 2:] << 4)
    if not fifth:
        return packed
    # Two bytes per input: bit j the fifth bit of output j.
    return np.concatenate([packed, np.packbits(_panels(codes >> 4), axis=-1, bitorder="little")], axis=-1)


def _int8_layout(codes: torch.Tensor) -> bool:
    """The int8 kernel's layout is ``[panels, blocks, chunks, 64]``: four dimensions where the
    float one has three."""
    return codes.dim() == 4


def _padded(codes: np.ndarray) -> np.ndarray:
    """``[n, k]`` with zero rows added up to whole panels."""
    n, k = codes.shape
    padded = -(-n // PANEL) * PANEL
    return codes if padded == n else np.concatenate([codes, np.zeros((padded - n, k), dtype=codes.dtype)])


def _panels(codes: np.ndarray) -> np.ndarray:
    """``[n, k]`` codes as ``[panels, k, 16]``, outputs padded with zero codes to whole panels."""
    codes = _padded(codes)
    return codes.reshape(-1, PANEL, codes.shape[1]).transpose(0, 2, 1)


def scale_format(scale: torch.Tensor) -> int:
    """csrc/kernels.h's ScaleFormat of a panel's scales: F32, F16 or K_FACTORS (bytes)."""
    return {torch.float32: 0, torch.float16: 1, torch.uint8: 2}[scale.dtype]


def _panel_factors(d: np.ndarray, q: np.ndarray) -> torch.Tensor:
    """K-quant factors (float16 ``d`` ``[n, groups / 8]``, bytes ``q`` ``[n, groups]``) as
    ``[panels, groups / 8, 160]`` bytes: per super-block the panel's 16 ``d``, then its 8 x 16 ``q``."""
    d16 = _panels(np.ascontiguousarray(d).view(np.uint16))  # [panels, super-blocks, 16]
    qs = _panels(q)  # [panels, groups, 16]
    panels, supers = d16.shape[:2]
    head = np.ascontiguousarray(d16).view(np.uint8).reshape(panels, supers, 32)
    return torch.from_numpy(np.concatenate([head, qs.reshape(panels, supers, 128)], axis=-1))


def _panel_scales(values: np.ndarray, dtype: type[np.floating]) -> torch.Tensor:
    """``[n, k / 32]`` per-block values as ``[panels, k / 32, 16]`` of ``dtype`` (padding: zero)."""
    return torch.from_numpy(np.ascontiguousarray(_panels(values.astype(dtype))))
