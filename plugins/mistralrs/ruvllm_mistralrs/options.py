"""Backend options (``[backends.mistralrs]`` in ruvllm.toml, or ``--option KEY=VALUE``).

Every option is checked here, before any weights are read, with an error that names the option
and what it accepts. The names are ruvllm's; :mod:`ruvllm_mistralrs.engine` maps them onto
mistral.rs's ``Runner`` arguments.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import attrs
from ruvllm.errors import BackendOptionError
from ruvllm.options import accepts, any_of, boolean, float_range, int_range, one_of, optional, positive_int

BACKEND = "mistralrs"

#: In-situ quantization types this plugin accepts (mistral.rs names). AFQ types are Metal-only
#: and FP8 needs a GPU, so they are left out of the CPU build's list in the docs.
ISQ_TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q8_1", "Q2K", "Q3K", "Q4K", "Q5K", "Q6K", "Q8K",
             "HQQ4", "HQQ8", "FP8", "AFQ2", "AFQ3", "AFQ4", "AFQ6", "AFQ8")
DTYPES = ("auto", "bf16", "f16", "f32")
PAGED_CACHE_TYPES = ("auto", "f8e4m3")
SERIAL_PREFILL = ("auto", "on", "off")

# Converters get no instance, so they name the backend themselves.


def _isq(value: Any) -> str:
    if value is None or value == "" or (isinstance(value, str) and value.lower() == "none"):
        return "none"
    if isinstance(value, str) and value.lower() == "auto":
        return "auto"
    if not isinstance(value, str) or value.upper() not in ISQ_TYPES:
        raise BackendOptionError(
            BACKEND, "isq", f"must be auto, none or one of {', '.join(ISQ_TYPES)} (any case), got {value!r}",
            value)
    return value.upper()


def _adapters(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BackendOptionError(
            BACKEND, "adapters", "must be a table of alias = \"path/to/peft-adapter-dir\"", value
        )
    out = {}
    for alias, path in value.items():
        if not isinstance(alias, str) or not alias or not isinstance(path, (str, Path)):
            raise BackendOptionError(
                BACKEND, "adapters", f"entry {alias!r} = {path!r} must be alias = \"dir\"", value
            )
        out[alias] = str(Path(path).expanduser())
    return out


def _xlora(value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not isinstance(value.get("model_id"), (str, Path)):
        raise BackendOptionError(
            BACKEND, "xlora", "must be a table with model_id = \"X-LoRA checkpoint dir\" (and optionally "
            "order = \"ordering.json\", tgt_non_granular_index = N)", value,
        )
    unknown = set(value) - {"model_id", "order", "tgt_non_granular_index"}
    if unknown:
        raise BackendOptionError(
            BACKEND, "xlora", f"has unknown key(s) {', '.join(sorted(unknown))}; accepted keys: model_id, "
            "order, tgt_non_granular_index", value,
        )
    order = value.get("order")
    if order is not None and not isinstance(order, (str, Path)):
        raise BackendOptionError(BACKEND, "xlora", f"order must be the path of an ordering JSON file, "
                                 f"got {order!r}", value)
    index = value.get("tgt_non_granular_index")
    if index is not None and (isinstance(index, bool) or not isinstance(index, int) or index < 0):
        raise BackendOptionError(
            BACKEND, "xlora", f"tgt_non_granular_index must be an integer >= 0 (completion tokens after "
            f"which the scalings are frozen), got {index!r}", value,
        )
    out: dict[str, Any] = {"model_id": str(value["model_id"]), "order": str(order) if order else None,
                           "tgt_non_granular_index": index}
    return out


_KV_SIZE_UNITS = ("GiB", "MiB", "GB", "MB", "tokens")

#: A fraction of GPU memory, or a KV size mistral.rs parses itself ("4GiB", "65536tokens").
_memory_goal = any_of(
    float_range(0.0, 1.0, low_open=True),
    accepts('a KV size such as "4GiB" or "65536tokens"',
            lambda v: isinstance(v, str) and v[:1].isdigit() and v.endswith(_KV_SIZE_UNITS)),
)


@attrs.frozen(kw_only=True)
class MistralRsOptions:
    """Options of the mistral.rs backend; parse them with ``ruvllm.options.parse_options``."""

    BACKEND: ClassVar[str] = BACKEND

    #: Sequences mistral.rs runs at once (its scheduler batches their decode steps).
    max_seqs: int = attrs.field(default=16, validator=positive_int())
    #: Finished sequences whose KV mistral.rs keeps for prefix reuse. 0 (the default) keeps none,
    #: so every request starts from a clean state and cached_tokens() is 0.
    prefix_cache_size: int = attrs.field(default=0, validator=int_range(0))
    #: Admit one new prompt into mistral.rs at a time ("on"), or let it prefill several prompts in
    #: one step ("off"). "auto" = on for quantized weights (GGUF, ISQ), whose CPU matmul fails or
    #: corrupts outputs when several prompts are prefilled together (see the docs).
    serial_prefill: str = attrs.field(default="auto", validator=one_of(SERIAL_PREFILL))
    #: In-situ quantization applied while loading (Hugging Face weights, or requantizing a GGUF):
    #: a type, "none" (the weights as the file has them), or "auto": on CPU builds, a GGUF of a
    #: type candle multiplies with a portable loop (Q4_1, Q5_0, Q5_1) becomes Q8_0 where memory
    #: allows (ruvllm_mistralrs.requantize says why and what it costs).
    isq: str = attrs.field(default="auto", converter=_isq)
    dtype: str = attrs.field(default="auto", validator=one_of(DTYPES))
    #: CPU threads of mistral.rs's compute pool (CANDLE_NUM_THREADS / RAYON_NUM_THREADS).
    #: Process-wide and fixed by the first model loaded in the process. Unset = an exported
    #: variable, else the CPUs this process may run on (see threads.py: the pool spin-waits, so
    #: more threads than CPUs collapses throughput).
    threads: int | None = attrs.field(default=None, validator=optional(positive_int()))
    #: Seed of mistral.rs's sampling RNG, set once for the whole engine.
    seed: int | None = attrs.field(default=None, validator=optional(int_range(0)))
    #: None = mistral.rs's default (on for CUDA/Metal, absent on CPU); true demands it.
    paged_attention: bool | None = attrs.field(default=None, validator=optional(boolean()))
    paged_block_size: int | None = attrs.field(default=None, validator=optional(positive_int()))
    paged_memory_goal: float | str | None = attrs.field(default=None, validator=optional(_memory_goal))
    paged_cache_type: str | None = attrs.field(default=None, validator=optional(one_of(PAGED_CACHE_TYPES)))
    #: LoRA adapters loaded at start: alias -> PEFT directory.
    adapters: dict[str, str] = attrs.field(factory=dict, converter=_adapters)
    #: Start the dynamic LoRA runtime even with no adapters, so they can be hot-loaded later.
    lora: bool = attrs.field(default=False, validator=boolean())
    #: Adapter used by requests that name none.
    adapter: str | None = None
    max_adapters: int = attrs.field(default=16, validator=positive_int())
    max_lora_rank: int = attrs.field(default=256, validator=positive_int())
    #: X-LoRA: {model_id, order, tgt_non_granular_index}; replaces dynamic LoRA (see ruvllm_mistralrs.xlora).
    xlora: dict[str, Any] | None = attrs.field(default=None, converter=_xlora)
    #: tokenizer.json to use instead of the GGUF's own tokenizer metadata.
    tokenizer_json: str | None = None

    @property
    def wants_paged_attention(self) -> bool:
        """Whether any option asks for PagedAttention, explicitly or through its settings."""
        return bool(self.paged_attention) or any(
            v is not None for v in (self.paged_block_size, self.paged_memory_goal, self.paged_cache_type)
        )

    @property
    def wants_lora(self) -> bool:
        return self.lora or bool(self.adapters) or self.adapter is not None

    def __attrs_post_init__(self) -> None:
        # Combinations that are each valid alone but contradict each other.
        if self.paged_attention is False and self.wants_paged_attention:
            raise BackendOptionError(BACKEND, "paged_attention", "is false but paged_* settings were given",
                                     False, fix="drop them or set paged_attention = true")
        if self.adapter is not None and self.adapter not in self.adapters:
            raise BackendOptionError(BACKEND, "adapter", f"names {self.adapter!r}, which is not in adapters "
                                     f"({', '.join(self.adapters) or 'none'})", self.adapter,
                                     fix="add it to [backends.mistralrs.adapters] or name one listed there")
        if self.xlora is not None and self.wants_lora:
            raise BackendOptionError(BACKEND, "xlora", "cannot be combined with dynamic LoRA "
                                     "(adapters/lora/adapter)", self.xlora,
                                     fix="drop either xlora or the adapters/lora/adapter options")
