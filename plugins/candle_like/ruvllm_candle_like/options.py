"""Backend options (``[backends.candle_like]`` in ruvllm.toml, or ``--option KEY=VALUE``).

Every option is validated here with an error naming the option and what it accepts, before
any weights are read.
"""

from __future__ import annotations

import re
from typing import ClassVar

import attrs
import torch
from ruvllm.errors import BackendOptionError, BackendUnavailable
from ruvllm.options import accepts, any_of, boolean, one_of, optional, positive_int

from ruvllm_candle_like import blockmm
from ruvllm_candle_like.cpu_dtype import fast_cpu_dtype, warn_if_slow, warn_once
from ruvllm_candle_like.int4 import unavailable as int4_unavailable

BACKEND = "candle_like"

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
KV_CACHES = ("fp16", "two_tier")
COLD_BITS = (4, 8)

#: Device names resolve_device understands (whether the device exists is checked there).
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
_device = accepts("auto, cpu, cuda, cuda:N or mps",
                  lambda v: isinstance(v, str) and _DEVICE.fullmatch(v) is not None)


@attrs.frozen(kw_only=True)
class BackendOptions:
    """Options of the candle_like backend; parse them with ``ruvllm.options.parse_options``."""

    BACKEND: ClassVar[str] = BACKEND

    #: auto | cpu | cuda | cuda:N | mps
    device: str = attrs.field(default="auto", validator=_device)
    #: auto | float32 | bfloat16 | float16. auto: on CPU what this CPU computes fast (bfloat16
    #: where bf16 is native, else float32; see ruvllm.hardware), float16 on CUDA/MPS; but float32
    #: for a GGUF whose blocks run on the int8-activation kernel (int4_weights, int8_activations)
    #: outside the AMX kind: its integer products outran oneDNN's bf16 matmuls at every row count
    #: measured on the AVX-512 kind, at a fifth of their memory (cpu_dtype.py).
    dtype: str = attrs.field(default="auto", validator=one_of(("auto", *DTYPES)))
    n_threads: int | None = attrs.field(default=None, validator=optional(positive_int()))
    #: Keep a oneDNN-packed copy of every projection for faster CPU matmuls (costs as much
    #: memory again as the projection weights; ignored off CPU).
    prepack_weights: bool = attrs.field(default=True, validator=boolean())
    #: GGUF on CPU: run the projections on the file's own blocks (block_codes.py: Q4_0/Q4_1/Q4_K
    #: as 4-bit codes, Q5_0/Q5_1/Q5_K as 5-bit, Q8_0 as 8-bit, Q6_K re-quantised to 8 bits, the tied
    #: head included) instead of dense float copies; other types and devices run dense.
    #: auto: on when computing in float32 where ruvllm's native block kernel runs (x86-64 with
    #: AVX2 and FMA, blockmm.py): there it measured faster than dense float32 at every row
    #: count, at a fifth of the memory, and a row's numerics do not depend on the step's row
    #: count. In bfloat16 (explicit, or dtype=auto on the AMX kind or on a CPU with native bf16
    #: where the block kernel does not run) auto stays dense: oneDNN's bf16 matmuls on AMX or
    #: avx512_bf16 are the fast path for prefill and big batches there. true: on in any dtype,
    #: also on torch's packed int4 kernel where the native one is missing (bf16 activations).
    int4_weights: bool | str = attrs.field(default="auto", validator=any_of(boolean(), one_of(("auto",))))
    #: With int4 weights: also keep a dense copy of them (in the compute dtype, packed per
    #: prepack_weights) for steps of at least dense_from_rows rows, where a dense matmul is faster
    #: (bfloat16 on AMX or avx512_bf16; on torch's int4 kernel prefill runs 2-3x slower). It costs
    #: the dense weights' memory again (405 MiB in float32 for the embedded model) and makes a
    #: row's numerics depend on the step's row count; off by default.
    dense_weights: bool = attrs.field(default=False, validator=boolean())
    #: With the GGUF's blocks on ruvllm's kernel: quantise each row's activations to int8 per block
    #: of 32 as llama.cpp does (its Q8_1) and multiply with integer dot products (AVX512-VNNI, or
    #: AVX2 with the same bits), the numerics llama.cpp itself runs (blockmm.py). auto and true: on
    #: wherever the block kernel runs (measured faster than float32 activations at every row count
    #: on both paths); false: float32 activations.
    int8_activations: bool | str = attrs.field(default="auto", validator=any_of(boolean(), one_of(("auto",))))
    dense_from_rows: int = attrs.field(default=20, validator=positive_int())
    #: With int4 weights: run the executor's decode-only steps of fewer than dense_from_rows rows
    #: as one torch.compile'd graph (inductor; needs a C++ compiler), compiled when the executor
    #: is created (logged, tens of seconds) so that no request waits for it.
    compile_decode: bool = attrs.field(default=False, validator=boolean())
    #: "fp16": unquantised 16-bit KV; "two_tier": FP16 hot tail + packed Q4/Q8 cold store.
    kv_cache: str = attrs.field(default="fp16", validator=one_of(KV_CACHES))
    #: Storage dtype of the unquantised cache: auto (float16, as llama.cpp's default cache,
    #: when computing in float32; otherwise the compute dtype) or a dtype name.
    kv_dtype: str = attrs.field(default="auto", validator=one_of(("auto", *DTYPES)))
    #: Two-tier cache: hot tail size in tokens, tokens migrated per batch, cold bits, group
    #: size of the per-head scales, and the most tokens kept (oldest evicted past it).
    hot_tokens: int = attrs.field(default=64, validator=positive_int())
    migrate_tokens: int = attrs.field(default=32, validator=positive_int())
    cold_bits: int = attrs.field(default=4, validator=one_of(COLD_BITS))
    group_size: int | None = attrs.field(default=None, validator=optional(positive_int()))
    max_kv_tokens: int | None = attrs.field(default=None, validator=optional(positive_int()))
    #: Executor: KV capacity in tokens (paged pool) and most tokens per step.
    kv_cache_tokens: int = attrs.field(default=32768, validator=positive_int())
    max_batch_tokens: int = attrs.field(default=2048, validator=positive_int())
    #: Longest prompt chunk run in one forward on the request-level path.
    prefill_chunk: int = attrs.field(default=512, validator=positive_int())
    #: Context window override (defaults to the model's).
    context_length: int | None = attrs.field(default=None, validator=optional(positive_int()))

    def __attrs_post_init__(self) -> None:
        # The two-tier cache moves migrate_tokens out of the hot tail at once, so it must fit in it.
        if self.migrate_tokens > self.hot_tokens:
            raise BackendOptionError(
                BACKEND, "migrate_tokens", f"must be <= hot_tokens ({self.hot_tokens}), got "
                f"{self.migrate_tokens}", self.migrate_tokens,
                fix="lower migrate_tokens or raise hot_tokens",
            )

    def resolve_device(self) -> torch.device:
        """The torch device to run on, or BackendUnavailable saying why it cannot be used."""
        name = self.device
        if name == "auto":
            if torch.cuda.is_available():
                return torch.device("cuda")
            if getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
                return torch.device("mps")
            return torch.device("cpu")
        if name == "cpu":
            return torch.device("cpu")
        if name.startswith("cuda"):
            if not torch.cuda.is_available():
                raise BackendUnavailable(
                    "candle_like", f"device={name!r} was asked for but this PyTorch build sees no CUDA "
                    f"GPU (torch {torch.__version__}, built with CUDA {torch.version.cuda}); "
                    "use device=cpu or install a CUDA build of torch"
                )
            return torch.device(name)
        # The device validator admits nothing else, so this is "mps".
        if getattr(torch.backends, "mps", None) is None or not torch.backends.mps.is_available():
            raise BackendUnavailable(
                "candle_like", "device='mps' was asked for but Metal (MPS) is not available here; "
                "use device=cpu (MPS needs Apple Silicon and a macOS build of torch)"
            )
        return torch.device("mps")

    def resolve_dtype(self, device: torch.device, model_format: str) -> torch.dtype:
        """The compute dtype; an explicit bfloat16 the CPU has no native kernels for still runs,
        after one warning saying what is missing and what it costs."""
        if self.dtype == "auto":
            if device.type != "cpu":
                return torch.float16
            on_int8_blocks = model_format == "gguf" and self.int4_weights is not False and self.resolve_int8()
            return fast_cpu_dtype(int8_blocks=on_int8_blocks)
        dtype = DTYPES[self.dtype]
        if device.type == "cpu" and dtype == torch.float16:
            raise BackendOptionError(BACKEND, "dtype", f"{self.dtype} is slow and poorly supported on CPU",
                                     self.dtype, fix="use auto, bfloat16 or float32 on CPU")
        warn_if_slow(dtype, device, BACKEND)
        return dtype

    def resolve_int4(self, device: torch.device, model_format: str, dtype: torch.dtype) -> bool:
        """Whether the projections run on the GGUF's blocks (see ``int4_weights``); an explicit
        true this machine has no kernel for runs dense after one warning saying why."""
        if device.type != "cpu" or model_format != "gguf" or self.int4_weights is False:
            return False
        if self.int4_weights == "auto":
            return dtype == torch.float32 and blockmm.unavailable() is None
        if blockmm.unavailable() is not None and (why := int4_unavailable()):
            warn_once("int4 unavailable", "candle_like: int4_weights has no effect: %s", why)
            return False
        return True

    def resolve_int8(self) -> bool:
        """Whether the block kernel quantises activations to int8 (see ``int8_activations``)."""
        if self.int8_activations == "auto":
            return blockmm.int8_by_default()
        if self.int8_activations and (why := blockmm.unavailable()) is not None:
            warn_once("int8 unavailable", "candle_like: int8_activations has no effect: %s", why)
            return False
        return bool(self.int8_activations)

    def resolve_kv_dtype(self, compute: torch.dtype) -> torch.dtype:
        if self.kv_dtype != "auto":
            return DTYPES[self.kv_dtype]
        return torch.float16 if compute == torch.float32 else compute
