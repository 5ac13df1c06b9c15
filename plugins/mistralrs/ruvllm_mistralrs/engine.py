"""Map ruvllm's options and model onto mistral.rs's ``Which`` and ``Runner`` arguments.

Kept apart from the backend so the mapping can be read (and tested) as one table: which ruvllm
option becomes which mistral.rs argument, and which combinations cannot run on this build.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ruvllm.errors import BackendUnavailable, ModelLoadError
from ruvllm.models import ModelSource

from ruvllm_mistralrs.options import MistralRsOptions
from ruvllm_mistralrs.platform import Build
from ruvllm_mistralrs.xlora import StagedXLora

#: A chat template that emits each message's content verbatim. Core renders the model's own
#: chat template and tokenizes it; mistral.rs must run those tokens, not template them again.
PASS_THROUGH_TEMPLATE = "{% for message in messages %}{{ message['content'] }}{% endfor %}"

_OPTION_OF_PAGED = {
    "paged_attention": "paged_attention",
    "paged_block_size": "paged_block_size",
    "paged_memory_goal": "paged_memory_goal",
    "paged_cache_type": "paged_cache_type",
}


def check_paged_attention(opts: MistralRsOptions, build: Build) -> None:
    """Fail before loading when the options demand PagedAttention this build does not have."""
    if not opts.wants_paged_attention or build.paged_kernels:
        return
    named = next(name for name in _OPTION_OF_PAGED if getattr(opts, name) not in (None, False))
    raise BackendUnavailable("mistralrs", f"option {named}={getattr(opts, named)!r} needs PagedAttention: "
                             f"{build.paged_attention_absent_reason}")


def which_for(m: Any, source: ModelSource, opts: MistralRsOptions, xlora: StagedXLora | None = None) -> Any:
    """The ``mistralrs.Which`` selecting ``source`` with the options' weights and adapters;
    ``xlora`` is the staged checkpoint when ``opts.xlora`` is set (:func:`stage_xlora`)."""
    dtype = {"auto": m.ModelDType.Auto, "bf16": m.ModelDType.BF16, "f16": m.ModelDType.F16,
             "f32": m.ModelDType.F32}[opts.dtype]
    path = Path(source.path)
    if source.format == "gguf":
        if opts.xlora is not None:
            raise ModelLoadError(source.name, "option xlora needs a Hugging Face directory (mistral.rs "
                                 "supports X-LoRA over GGUF for Phi-3 only); convert the model with "
                                 "`ruvllm convert` and load the directory")
        extra: dict[str, Any] = {}
        if opts.wants_lora:
            extra = dict(adapters=[], max_adapters=opts.max_adapters, max_rank=opts.max_lora_rank)
        return m.Which.GGUF(quantized_model_id=str(path.parent), quantized_filename=path.name,
                            dtype=dtype, tokenizer_json=opts.tokenizer_json, **extra)
    if opts.xlora is not None:
        if xlora is None:
            raise ValueError("option xlora needs the staged checkpoint (ruvllm_mistralrs.xlora.stage_xlora)")
        return m.Which.XLora(xlora_model_id=xlora.model_id, order=xlora.order, model_id=str(path),
                             tgt_non_granular_index=opts.xlora["tgt_non_granular_index"], dtype=dtype,
                             tokenizer_json=opts.tokenizer_json)
    if opts.wants_lora:
        return m.Which.Lora(model_id=str(path), adapters=[], dtype=dtype, tokenizer_json=opts.tokenizer_json,
                            max_adapters=opts.max_adapters, max_rank=opts.max_lora_rank)
    return m.Which.Plain(model_id=str(path), dtype=dtype, tokenizer_json=opts.tokenizer_json)


def runner_kwargs(m: Any, opts: MistralRsOptions, build: Build, template_file: Path, *,
                  isq: str | None) -> dict[str, Any]:
    """``Runner(...)`` arguments other than ``which``; ``isq`` is the resolved type
    (ruvllm_mistralrs.requantize), not the option."""
    kwargs: dict[str, Any] = dict(
        max_seqs=opts.max_seqs,
        prefix_cache_n=opts.prefix_cache_size,
        jinja_explicit=str(template_file),
        in_situ_quant=isq,
        seed=opts.seed,
        token_source="none",  # local files only: never look for a hub token
    )
    if build.paged_kernels:
        if opts.paged_attention is True:
            kwargs["paged_attn"] = True
        elif opts.paged_attention is False:
            kwargs["no_paged_attn"] = True
        if opts.paged_block_size is not None:
            kwargs["pa_blk_size"] = opts.paged_block_size
        if opts.paged_memory_goal is not None:
            kwargs["memory_goal"] = opts.paged_memory_goal
        if opts.paged_cache_type is not None:
            kinds = getattr(m, "PagedCacheType", None)
            if kinds is None:
                raise BackendUnavailable("mistralrs", "option paged_cache_type: this mistral.rs build "
                                         "exports no PagedCacheType")
            kwargs["pa_cache_type"] = {"auto": kinds.Auto, "f8e4m3": kinds.F8E4M3}[opts.paged_cache_type]
    return kwargs


def serial_prefill(opts: MistralRsOptions, source: ModelSource, *, isq: str | None) -> bool:
    """Whether prompts must enter mistral.rs one at a time (see MistralRsOptions.serial_prefill);
    ``isq`` is the resolved type, as for :func:`runner_kwargs`."""
    if opts.serial_prefill != "auto":
        return opts.serial_prefill == "on"
    return source.format == "gguf" or isq is not None
