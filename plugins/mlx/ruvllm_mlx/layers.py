"""Linear projections and embeddings that hold weights either packed or dequantized.

Packed ("quantized") weights run through ``mx.quantized_matmul``; dequantized weights are kept
transposed and contiguous (``[in, out]``) because MLX's CPU matmul on a transposed view was
measured at half the speed of the contiguous layout.
"""

from __future__ import annotations

from ruvllm.errors import ModelLoadError

from ruvllm_mlx.mlx_core import mx


def packed_bits(weight: mx.array, scales: mx.array, group_size: int) -> int:
    """Bits per element of an affine-packed ``uint32`` weight, from the tensor shapes."""
    elements = scales.shape[-1] * group_size
    bits = weight.shape[-1] * 32 // elements
    if bits not in (2, 3, 4, 5, 6, 8) or weight.shape[-1] * 32 != bits * elements:
        raise ModelLoadError("weights", f"cannot infer quantization bits from shapes "
                                        f"{weight.shape} / {scales.shape}")
    return bits


class Linear:
    """``y = x @ W.T (+ b)`` for ``W`` of shape ``[out, in]``."""

    def __init__(self, weight: mx.array, *, scales: mx.array | None = None, biases: mx.array | None = None,
                 bias: mx.array | None = None, group_size: int = 32, mode: str, dtype: mx.Dtype,
                 quantize_bits: int = 4, quantize_group_size: int = 32):
        self.bias = None if bias is None else bias.astype(dtype)
        self.quantized = False
        if scales is not None:
            self.bits = packed_bits(weight, scales, group_size)
            self.group_size = group_size
            if mode == "quantized":
                self.quantized = True
                self.weight = weight
                self.scales = scales.astype(dtype)
                self.biases = biases.astype(dtype)
                self.out_features = weight.shape[0]
                return
            weight = mx.dequantize(weight, scales, biases, group_size=group_size, bits=self.bits)
        self.out_features = weight.shape[0]
        if mode == "quantized" and weight.shape[-1] % quantize_group_size == 0:
            self.quantized = True
            self.bits, self.group_size = quantize_bits, quantize_group_size
            w, s, b = mx.quantize(weight.astype(dtype), group_size=quantize_group_size, bits=quantize_bits)
            self.weight, self.scales, self.biases = w, s, b
            return
        self.weight_t = mx.contiguous(weight.astype(dtype).T)

    def __call__(self, x: mx.array) -> mx.array:
        if self.quantized:
            y = mx.quantized_matmul(x, self.weight, self.scales, self.biases, transpose=True,
                                    group_size=self.group_size, bits=self.bits)
        else:
            y = x @ self.weight_t
        return y if self.bias is None else y + self.bias

    def rows(self, ids: mx.array) -> mx.array:
        """Rows ``W[ids]`` (an embedding lookup on the same storage, for tied embeddings)."""
        if self.quantized:
            return mx.dequantize(self.weight[ids], self.scales[ids], self.biases[ids],
                                 group_size=self.group_size, bits=self.bits)
        return mx.take(self.weight_t, ids, axis=1).T

    def arrays(self) -> list[mx.array]:
        out = [self.weight, self.scales, self.biases] if self.quantized else [self.weight_t]
        return out if self.bias is None else [*out, self.bias]
