"""GGUF metadata of a loaded model, and the :class:`ruvllm.types.ModelInfo` built from it.

The chat template, special tokens and architecture come from the file itself, so a model is
prompted in the dialect it was trained on without any per-model table in ruvllm.
"""

from __future__ import annotations

import ctypes
from types import ModuleType

from ruvllm.models import ModelSource
from ruvllm.types import ModelInfo, SpecialTokens

from ruvllm_llamacpp.tokenizer import LlamaCppTokenizer


def read_metadata(llama_cpp: ModuleType, model: int) -> dict[str, str]:
    """Every GGUF key/value of ``model`` as strings (arrays are summarised by llama.cpp)."""
    out: dict[str, str] = {}
    size = 1024
    buf = ctypes.create_string_buffer(size)

    def read(fn, index: int) -> str:
        nonlocal size, buf
        n = fn(model, index, buf, size)
        if n >= size:  # truncated (chat templates are often several KB): grow and re-read
            size = n + 1
            buf = ctypes.create_string_buffer(size)
            n = fn(model, index, buf, size)
        return buf.raw[: max(n, 0)].decode("utf-8", errors="replace")

    for i in range(llama_cpp.llama_model_meta_count(model)):
        key = read(llama_cpp.llama_model_meta_key_by_index, i)
        out[key] = read(llama_cpp.llama_model_meta_val_str_by_index, i)
    return out


def file_type_name(llama_cpp: ModuleType, code: str | None) -> str | None:
    """``general.file_type`` (llama_ftype) as its quantization name, e.g. 3 -> "Q4_1"."""
    if code is None:
        return None
    try:
        value = int(code)
    except ValueError:
        return code
    for attr in dir(llama_cpp):
        if attr == "LLAMA_FTYPE_GUESSED" or not attr.startswith("LLAMA_FTYPE_"):
            continue
        if getattr(llama_cpp, attr) == value:
            return attr.removeprefix("LLAMA_FTYPE_").removeprefix("MOSTLY_")
    return f"ftype {value}"


def model_info(
    llama_cpp: ModuleType,
    model: int,
    source: ModelSource,
    metadata: dict[str, str],
    tokenizer: LlamaCppTokenizer,
    n_ctx: int,
) -> ModelInfo:
    bos, eos = tokenizer.bos_token_id, tokenizer.eos_token_id
    special = SpecialTokens(
        bos_id=tokenizer.bos_id,
        eos_ids=tokenizer.eos_ids,
        pad_id=_int_or_none(metadata.get("tokenizer.ggml.padding_token_id")),
        # Templates write {{ bos_token }} themselves even where the tokenizer does not add it.
        bos_text=tokenizer.token_text(bos) if bos is not None else "",
        eos_text=tokenizer.token_text(eos) if eos is not None else "",
        fim=tokenizer.fim_tokens(),
    )
    n_params = int(llama_cpp.llama_model_n_params(model))
    return ModelInfo(
        name=source.name,
        architecture=metadata.get("general.architecture", "unknown"),
        context_length=n_ctx,
        vocab_size=tokenizer.vocab_size,
        special_tokens=special,
        chat_template=metadata.get("tokenizer.chat_template") or None,
        path=str(source.path),
        quantization=file_type_name(llama_cpp, metadata.get("general.file_type")),
        parameters=n_params if n_params > 0 else None,
    )


def _int_or_none(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
