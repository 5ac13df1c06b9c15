"""Whether ``auto`` should pick candle_like for a model on this machine, answered without
importing torch: every process that picks a backend asks (ruvllm.backend.LlmBackend.fastest_here).

The claim is what was measured, no more (docs/benchmark.md, issue 59's table). On the AVX-512
kind with AVX512-VNNI (the 2-core AMD EPYC), its native layers on a GGUF's blocks with int8
activations served the embedded model 1.8x llama-server's tokens/s with one client, 4.3x with
16 and 3.6x with 16 long prompts, at a fifth of the TTFT, and the default server idled at ~400 MB
resident; a Q4_K_M file of the same model (Q5_0, Q4_K, Q8_0 and Q6_K tensors, Q6_K re-quantised)
1.7x, 2.0x and 2.8x, where ruvllm's llamacpp backend served 0.84-0.95x. So it claims a GGUF
model whose every projection the block kernel runs, in not much more memory than the file
(EXTRA_WEIGHT_BYTES), on a CPU of that kind where the native library was built.

Where it does not claim, llamacpp stays first: on the AVX2 kind candle_like also served fastest
(float32 activations), but a fresh clone's default server idled at 545 MB there before the cuts
that took ~46 MB off (not yet measured on that kind), over the 500 MB promise; the AMX kind was
not measured on these kernels.
"""

from __future__ import annotations

from ruvllm.errors import ModelError
from ruvllm.gguf_file import GgufTensor, read_gguf_file
from ruvllm.hardware import cpu_info
from ruvllm.models import ModelSource

from ruvllm_candle_like import native
from ruvllm_candle_like.config import GGUF_ARCHITECTURES

#: The types block_codes.py re-quantises to 8-bit codes (their groups of 16 have scales of their
#: own); it maps the other types of KERNEL_BYTES as stored.
REQUANTISED_TYPES = ("Q6_K",)
#: Bytes the block kernel holds per 32 weights of each type it runs (blockmm.py): 4, 5 or 8-bit
#: codes and a scale and an offset per 32, float16 where the file's values are, the K-quants'
#: factors (2.5 bytes a group) for theirs.
KERNEL_BYTES = {"Q4_0": 20, "Q4_1": 20, "Q4_K": 18.5, "Q5_0": 24, "Q5_1": 24, "Q5_K": 22.5, "Q8_0": 36,
                "Q6_K": 36}
#: How many more bytes than the file's the kernel's weights may hold where candle_like claims a
#: model: ruvllm's llamacpp server keeps its 256 MiB KV pool resident from the start, candle_like
#: maps its pool as requests fill it, so up to this much more in weights its idle server is still
#: the smaller one. Past it (a 7B Q4_K_M: its ~1.1 G Q6_K weights as 8-bit codes add ~0.4 GiB)
#: llamacpp stays.
EXTRA_WEIGHT_BYTES = 256 << 20
#: A layer's projection tensors in a GGUF.
PROJECTION_TENSORS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
#: What was measured, for the log line and ``ruvllm serve``'s banner.
MEASURED = ("on the AVX-512 kind with VNNI its native layers on the GGUF's blocks (int8 activations) "
            "served the embedded model fastest of ruvllm's backends at 1 to 32 clients: 1.8x "
            "llama-server's tokens/s with one client, 4.3x with 16, 3.6x with 16 long prompts; "
            "a Q4_K_M file of it 1.7x, 2.0x and 2.8x (docs/benchmark.md)")
#: The CPU flags the int8-activation kernel needs (csrc/blockmm_int8.cpp), as /proc/cpuinfo names them.
INT8_KERNEL_FLAGS = frozenset({"avx512f", "avx512bw", "avx512_vnni", "f16c"})


def fastest_here(model: ModelSource) -> str | None:
    """Why candle_like serves ``model`` fastest here, or None when that was not measured."""
    if model.format != "gguf":
        return None
    cpu = cpu_info()
    # usable_flags: what ONEDNN_MAX_CPU_ISA (an emulated, older CPU) leaves of the CPU's flags.
    if cpu.kind != "avx512" or not cpu.usable_flags >= INT8_KERNEL_FLAGS:
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
    if not projections or any(t.type_name not in KERNEL_BYTES or t.shape[1] % 16 for t in projections):
        return None
    tables = [t for t in header.tensors if t.name in ("token_embd.weight", "output.weight")]
    if extra_weight_bytes([*projections, *tables]) > EXTRA_WEIGHT_BYTES:
        return None
    return MEASURED


def extra_weight_bytes(tensors: list[GgufTensor]) -> int:
    """How many more bytes candle_like holds ``tensors`` in than the file does: on the block
    kernel's blocks, or float32 for a type it does not run (a table in F16, say)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    extra = 0
    for t in tensors:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.type)]
        per_32 = KERNEL_BYTES.get(t.type_name, 4 * 32)
        extra += int(t.n_elements * per_32) // 32 - t.n_elements * size // block
    return extra
