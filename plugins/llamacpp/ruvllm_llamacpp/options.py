"""The ``[backends.llamacpp]`` options, validated before any model file is touched.

Options arrive from TOML or ``--option KEY=VALUE`` as loosely typed values; a wrong one must
fail with the option's name and the accepted range, not deep inside llama.cpp (where a bad
``n_ctx`` or ``n_batch`` aborts the process or silently falls back to another value).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import attrs
from ruvllm.errors import ConfigError

SECTION = "backends.llamacpp"


class LlamaCppOptionError(ConfigError):
    """One ``[backends.llamacpp]`` option is unknown or out of range."""

    def __init__(self, field: str, message: str, value: Any = None):
        self.field = field
        self.value = value
        super().__init__(
            f"{SECTION}.{field}: {message}; set it in the [{SECTION}] table of ruvllm.toml "
            f"or with --option {field}=VALUE"
        )


def default_threads() -> int:
    """CPUs this process may run on (the affinity mask, which containers restrict)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return os.cpu_count() or 1


def _int(low: int, what: str):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int):
            raise LlamaCppOptionError(
                attribute.name, f"must be an integer {what}, got {value!r} ({type(value).__name__})", value
            )
        if value < low:
            raise LlamaCppOptionError(attribute.name, f"must be an integer {what}, got {value}", value)

    return check


def _bool(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    if not isinstance(value, bool):
        raise LlamaCppOptionError(
            attribute.name, f"must be true or false, got {value!r} ({type(value).__name__})", value
        )


#: Smallest context llama.cpp is useful with; below it a prompt plus one token hardly fits.
MIN_CTX = 16


def _n_ctx(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
    _int(0, f"of at least {MIN_CTX} (or 0 for the model's training context)")(instance, attribute, value)
    if 0 < value < MIN_CTX:
        raise LlamaCppOptionError(
            "n_ctx", f"must be at least {MIN_CTX} (or 0 for the model's training context), got {value}", value
        )


@attrs.frozen(kw_only=True)
class LlamaCppOptions:
    """Options of the llama.cpp backend; see docs/backends/llamacpp.md."""

    #: Context window in tokens; capped at the model's training context (0 = that context).
    n_ctx: int = attrs.field(default=4096, validator=_n_ctx)
    #: Threads for decoding and prompt processing.
    n_threads: int = attrs.field(factory=default_threads, validator=_int(1, ">= 1"))
    #: Prompt tokens evaluated per llama_decode call (prefill chunk), capped at n_ctx.
    n_batch: int = attrs.field(default=512, validator=_int(1, ">= 1"))
    #: Layers offloaded to the GPU (-1 = all); needs a GPU build of llama-cpp-python.
    n_gpu_layers: int = attrs.field(default=0, validator=_int(-1, ">= -1 (-1 offloads every layer)"))
    #: Keep the KV of the previous call and re-evaluate only the part of a new prompt that
    #: differs from it. Off by default: every call then starts from an empty KV.
    prefix_reuse: bool = attrs.field(default=False, validator=_bool)
    #: llama.cpp's flash attention kernels (off by default, as in llama-cpp-python).
    flash_attn: bool = attrs.field(default=False, validator=_bool)
    #: Let llama.cpp print its load and performance logs to stderr.
    verbose: bool = attrs.field(default=False, validator=_bool)

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> LlamaCppOptions:
        known = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise LlamaCppOptionError(
                unknown[0],
                f"unknown option (known options: {', '.join(sorted(known))})",
                options[unknown[0]],
            )
        return cls(**dict(options))
