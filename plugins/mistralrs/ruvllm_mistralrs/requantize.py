"""Which in-situ quantization (ISQ) a load applies: the ``isq`` option resolved against the file.

mistral.rs multiplies GGUF weights on the CPU with candle's quantized kernels, and candle has
SIMD kernels for some block types only. For Q4_1, Q5_0 and Q5_1 it runs a portable per-block
loop: on a 2-core AVX2 EPYC the embedded SmolLM2-135M decoded one stream at 12.1 tok/s as Q4_1,
8.9 as Q5_0 and 7.5 as Q5_1, against 36.6-38.8 as Q4_0 or Q8_0 (``perf`` put 39 % of a call in
``BlockQ4_1::vec_dot_unopt``). Requantizing such a file to Q8_0 while loading costs about 0.6 s
and keeps its quality (perplexity 11.073 against 11.074 for Q4_1 as is; Q8_0's error is small
beside the 4- and 5-bit grid it re-encodes), so ``isq = "auto"`` does it, where memory allows:
Q8_0 takes 34 bytes per 32 weights, Q4_1 20, so the weights grow by about 1.7x (+64 MiB resident
for the embedded model). A file whose growth would take more than half of the memory available
now keeps its own weights, and the reason is logged and shown in the capability notes.

GPU builds multiply these types with their own kernels, so ``auto`` touches only CPU builds.
"""

from __future__ import annotations

from pathlib import Path

import attrs
from ruvllm.models import ModelSource

from ruvllm_mistralrs.platform import Build

#: The GGUF types candle multiplies with its portable loop (measured slow above).
SLOW_CPU_TYPES = frozenset({"Q4_1", "Q5_0", "Q5_1"})
#: The share of the memory available at load that requantized weights may add.
MAX_SHARE_OF_AVAILABLE = 0.5


@attrs.frozen
class IsqChoice:
    """The ISQ type a load passes to mistral.rs (None: the weights as the file has them)."""

    isq: str | None
    #: Why ``auto`` chose this (None when the option named the type, or "none", itself).
    reason: str | None = None


def resolve_isq(requested: str, source: ModelSource, file_type: str | None, build: Build,
                available_bytes: int | None = None) -> IsqChoice:
    """``requested`` is the parsed option: ``"auto"``, ``"none"`` or an ISQ type name."""
    if requested != "auto":
        return IsqChoice(None if requested == "none" else requested)
    if source.format != "gguf" or build.device != "cpu" or file_type not in SLOW_CPU_TYPES:
        return IsqChoice(None)
    # Here, not at import: every server registers this plugin, and gguf (with the yaml it
    # imports) is ~5 MB resident that a server on another backend never uses.
    import psutil
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    # Both types store 32 weights a block, so the bytes grow as the block sizes do.
    block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType[file_type]][1]
    q8_0_block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType.Q8_0][1]
    growth = Path(source.path).stat().st_size * (q8_0_block_bytes / block_bytes - 1)
    available = psutil.virtual_memory().available if available_bytes is None else available_bytes
    why = f"candle's CPU kernel for {file_type} is a portable loop, about 3x slower than Q8_0's"
    if growth > MAX_SHARE_OF_AVAILABLE * available:
        return IsqChoice(None, (
            f"isq auto: kept the file's {file_type} weights ({why}), since requantizing would add about "
            f"{growth / 2**20:,.0f} MiB and {available / 2**20:,.0f} MiB is available; set isq = \"Q8_0\" "
            "to requantize anyway"))
    return IsqChoice("Q8_0", (
        f"isq auto: {file_type} weights requantized to Q8_0 at load ({why}; perplexity unchanged), about "
        f"{growth / 2**20:,.0f} MiB more resident; set isq = \"none\" to keep the file's weights"))
