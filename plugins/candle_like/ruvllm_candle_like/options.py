"""Backend options (``[backends.candle_like]`` in ruvllm.toml, or ``--option KEY=VALUE``).

Every option is validated here with an error naming the option and what it accepts, before
any weights are read.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
import torch
from ruvllm.errors import BackendUnavailable, InvalidRequest

DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
          "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}
KV_CACHES = ("fp16", "two_tier")
COLD_BITS = (4, 8)


def _in(choices: tuple[str, ...]):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value not in choices:
            raise InvalidRequest(attribute.name, f"must be one of {', '.join(choices)}; got {value!r}",
                                 value)
    return check


def _positive(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(attribute.name, f"must be a positive integer; got {value!r}", value)


@attrs.frozen(kw_only=True)
class BackendOptions:
    #: auto | cpu | cuda | cuda:N | mps
    device: str = "auto"
    #: auto | float32 | bfloat16 | float16 (auto: float32 on CPU for llama.cpp-identical greedy
    #: output; float16 on CUDA/MPS).
    dtype: str = "auto"
    n_threads: int | None = attrs.field(default=None, validator=_positive)
    #: "fp16": unquantised 16-bit KV; "two_tier": FP16 hot tail + packed Q4/Q8 cold store.
    kv_cache: str = attrs.field(default="fp16", validator=_in(KV_CACHES))
    #: Storage dtype of the unquantised cache: auto (float16, as llama.cpp's default cache,
    #: when computing in float32; otherwise the compute dtype) or a dtype name.
    kv_dtype: str = "auto"
    #: Two-tier cache: hot tail size in tokens, tokens migrated per batch, cold bits, group
    #: size of the per-head scales, and the most tokens kept (oldest evicted past it).
    hot_tokens: int = attrs.field(default=64, validator=_positive)
    migrate_tokens: int = attrs.field(default=32, validator=_positive)
    cold_bits: int = 4
    group_size: int | None = attrs.field(default=None, validator=_positive)
    max_kv_tokens: int | None = attrs.field(default=None, validator=_positive)
    #: Executor: KV capacity in tokens (paged pool) and most tokens per step.
    kv_cache_tokens: int = attrs.field(default=32768, validator=_positive)
    max_batch_tokens: int = attrs.field(default=2048, validator=_positive)
    #: Longest prompt chunk run in one forward on the request-level path.
    prefill_chunk: int = attrs.field(default=512, validator=_positive)
    #: Context window override (defaults to the model's).
    context_length: int | None = attrs.field(default=None, validator=_positive)

    def __attrs_post_init__(self) -> None:
        if self.cold_bits not in COLD_BITS:
            raise InvalidRequest("cold_bits", f"must be 4 or 8; got {self.cold_bits!r}", self.cold_bits)
        if self.dtype != "auto" and self.dtype not in DTYPES:
            raise InvalidRequest("dtype", f"must be auto or one of {', '.join(DTYPES)}; got {self.dtype!r}")
        if self.kv_dtype != "auto" and self.kv_dtype not in DTYPES:
            raise InvalidRequest("kv_dtype",
                                 f"must be auto or one of {', '.join(DTYPES)}; got {self.kv_dtype!r}")
        if self.migrate_tokens > self.hot_tokens:
            raise InvalidRequest("migrate_tokens", f"must be <= hot_tokens ({self.hot_tokens})")

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> BackendOptions:
        known = {f.name for f in attrs.fields(cls)}
        unknown = set(options) - known
        if unknown:
            raise InvalidRequest(
                sorted(unknown)[0], f"unknown candle_like option; known options: {', '.join(sorted(known))}"
            )
        return cls(**options)

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
        if name == "mps":
            if getattr(torch.backends, "mps", None) is None or not torch.backends.mps.is_available():
                raise BackendUnavailable(
                    "candle_like", "device='mps' was asked for but Metal (MPS) is not available here; "
                    "use device=cpu (MPS needs Apple Silicon and a macOS build of torch)"
                )
            return torch.device("mps")
        raise InvalidRequest("device", f"must be auto, cpu, cuda, cuda:N or mps; got {name!r}", name)

    def resolve_dtype(self, device: torch.device) -> torch.dtype:
        if self.dtype == "auto":
            return torch.float32 if device.type == "cpu" else torch.float16
        dtype = DTYPES[self.dtype]
        if device.type == "cpu" and dtype == torch.float16:
            raise InvalidRequest("dtype",
                                 "float16 is slow and poorly supported on CPU; use bfloat16 or float32")
        return dtype

    def resolve_kv_dtype(self, compute: torch.dtype) -> torch.dtype:
        if self.kv_dtype != "auto":
            return DTYPES[self.kv_dtype]
        return torch.float16 if compute == torch.float32 else compute
