"""The MLX backend's options (``[backends.mlx]`` in ruvllm.toml or ``--option KEY=VALUE``).

Defaults depend on the device because the two devices reward opposite choices: on the Metal
GPU MLX's quantized matmul kernels read 4-bit weights and win; on a Linux CPU the ``mlx[cpu]``
wheel's quantized matmul and its half-precision GEMM are both slower than fp32 matmul on
dequantized weights (measured; see docs/backends/mlx.md), so the CPU default dequantizes.
"""

from __future__ import annotations

from typing import ClassVar

import attrs
from ruvllm.options import boolean, one_of, optional, positive_int

WEIGHT_MODES = ("auto", "quantized", "dequantized")
KV_CACHE_MODES = ("float", "quantized")
DTYPES = ("auto", "float32", "float16", "bfloat16")


@attrs.frozen(kw_only=True)
class MlxOptions:
    """Options of the MLX backend; parse them with ``ruvllm.options.parse_options``."""

    BACKEND: ClassVar[str] = "mlx"

    #: "quantized" keeps packed weights and runs ``mx.quantized_matmul``; "dequantized"
    #: expands them once at load to ``dtype``; "auto" picks per device (Metal: quantized).
    weights: str = attrs.field(default="auto", validator=one_of(WEIGHT_MODES))
    #: Activation / dequantized-weight dtype; "auto" = float16 on Metal, float32 on CPU. Unlike
    #: candle_like's, this auto does not ask ruvllm.hardware about native bf16: MLX's CPU bf16
    #: matmul widens to float32 in portable SIMD code whatever the CPU offers, and measured no
    #: faster than float32 (slower at one row) on a CPU with AVX512_BF16 (docs/backends/mlx.md).
    dtype: str = attrs.field(default="auto", validator=one_of(DTYPES))
    #: "quantized" stores cached K/V with ``mx.quantize`` (affine, ``kv_bits``/``kv_group_size``).
    kv_cache: str = attrs.field(default="float", validator=one_of(KV_CACHE_MODES))
    kv_bits: int = attrs.field(default=8, validator=one_of((4, 8)))
    kv_group_size: int = attrs.field(default=32, validator=one_of((32, 64)))
    #: Bits for quantizing an unquantized Hugging Face checkpoint when weights="quantized".
    quantize_bits: int = attrs.field(default=4, validator=one_of((4, 8)))
    quantize_group_size: int = attrs.field(default=32, validator=one_of((32, 64)))
    #: Cap the context window below the model's (memory); None keeps the model's.
    context_length: int | None = attrs.field(default=None, validator=optional(positive_int()))
    #: Compile the per-layer dense blocks with ``mx.compile``.
    compile: bool = attrs.field(default=False, validator=boolean())

    def resolved_weights(self, metal: bool) -> str:
        if self.weights != "auto":
            return self.weights
        return "quantized" if metal else "dequantized"

    def resolved_dtype(self, metal: bool) -> str:
        if self.dtype != "auto":
            return self.dtype
        return "float16" if metal else "float32"
