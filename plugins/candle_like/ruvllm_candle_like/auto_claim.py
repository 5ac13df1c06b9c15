"""Whether ``auto`` should pick candle_like for a model on this machine, answered without
importing torch: every process that picks a backend asks (ruvllm.backend.LlmBackend.fastest_here).

The claim is what was measured, no more (docs/benchmark.md, issue 59's table). On the AVX-512
kind with AVX512-VNNI (the 2-core AMD EPYC), its native layers on a GGUF's blocks with int8
activations served the embedded model 1.8x llama-server's tokens/s with one client, 4.3x with
16 and 3.6x with 16 long prompts, at a fifth of the TTFT, and the default server idled at ~400 MB
resident; a Q4_K_M file of the same model (Q5_0, Q4_K, Q8_0 and Q6_K tensors: 8-bit codes, Q6_K
re-quantised) 1.2x, 2.0x and 2.6x, where ruvllm's llamacpp backend served 0.68-0.96x. So it
claims a GGUF model whose every projection the block kernel runs, on a CPU of that kind where
the native library was built.

Where it does not claim, llamacpp stays first: on the AVX2 kind candle_like also served fastest
(float32 activations), but a fresh clone's default server idled at 545 MB there before the cuts
that took ~46 MB off (not yet measured on that kind), over the 500 MB promise; the AMX kind was
not measured on these kernels.
"""

from __future__ import annotations

from ruvllm.errors import ModelError
from ruvllm.gguf_file import read_gguf_file
from ruvllm.hardware import cpu_info
from ruvllm.models import ModelSource

from ruvllm_candle_like import native
from ruvllm_candle_like.config import GGUF_ARCHITECTURES

#: The GGUF types block_codes.py maps onto 4-bit codes, group 32, without re-quantising: the
#: block kernel runs them as stored.
FOUR_BIT_TYPES = ("Q4_0", "Q4_1", "Q4_K")
#: The types it maps onto 8-bit codes as stored.
EIGHT_BIT_TYPES = ("Q5_0", "Q5_1", "Q5_K", "Q8_0")
#: The types it re-quantises to 8-bit codes (their groups of 16 have scales of their own).
REQUANTISED_TYPES = ("Q6_K",)
#: Every type the block kernel runs.
BLOCK_TYPES = (*FOUR_BIT_TYPES, *EIGHT_BIT_TYPES, *REQUANTISED_TYPES)
#: A layer's projection tensors in a GGUF.
PROJECTION_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
#: What was measured, for the log line and ``ruvllm serve``'s banner.
MEASURED = ("on the AVX-512 kind with VNNI its native layers on the GGUF's blocks (int8 activations) "
            "served the embedded model fastest of ruvllm's backends at 1 to 32 clients: 1.8x "
            "llama-server's tokens/s with one client, 4.3x with 16, 3.6x with 16 long prompts; "
            "a Q4_K_M file of it 1.2x, 2.0x and 2.6x (docs/benchmark.md)")
#: The CPU flags the int8-activation kernel needs (csrc/blockmm_int8.cpp), as /proc/cpuinfo names them.
INT8_KERNEL_FLAGS = frozenset({"avx512f", "avx512bw", "avx512_vnni", "f16c"})


def fastest_here(model: ModelSource) -> str | None:
    """Why candle_like serves ``model`` fastest here, or None when that was not measured."""
    if model.format != "gguf":
        return None
    cpu = cpu_info()
    if cpu.kind != "avx512" or not cpu.flags >= INT8_KERNEL_FLAGS:
        return None
    if native.library_path() is None:
        return None
    try:
        header = read_gguf_file(model.path)
    except ModelError:
        return None  # the loader says what is wrong with the file
    arch = header.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        return None
    heads = header.get(f"{arch}.attention.head_count") or 1
    head_dim = (header.get(f"{arch}.attention.key_length")
                or header.get(f"{arch}.embedding_length", 0) // heads)
    if head_dim % 16:  # the native decoder's RoPE and attention work in whole vectors
        return None
    projections = [t for t in header.tensors
                   if t.name.startswith("blk.") and t.name.split(".")[2] in PROJECTION_TENSORS]
    # Outputs in whole panels of 16 (GGUF shapes put the input dimension first).
    if not projections or any(t.type_name not in BLOCK_TYPES or t.shape[1] % 16 for t in projections):
        return None
    return MEASURED
