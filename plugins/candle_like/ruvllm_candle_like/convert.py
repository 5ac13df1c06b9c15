"""GGUF -> Hugging Face directory, so engines that read safetensors (mistral.rs with ISQ, PEFT,
transformers) can use a model that ships only as GGUF, such as the embedded SmolLM2.

Quantised GGUF weights are dequantised (to float32 by default, or bfloat16/float16); q/k rows
are un-permuted back to the Hugging Face layout, and the tokenizer llama.cpp would use is saved
as a standard ``tokenizer.json``.
"""

from __future__ import annotations

from pathlib import Path

import torch
from ruvllm.errors import InvalidRequest
from ruvllm.hf_tokenizer import HfTokenizer

from ruvllm_candle_like.gguf_loader import read_gguf
from ruvllm_candle_like.writers import save_hf

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def gguf_to_hf(src: str | Path, dst: str | Path, *, dtype: str = "float32", overwrite: bool = False) -> Path:
    """Convert the GGUF file ``src`` into the Hugging Face directory ``dst``; returns ``dst``."""
    if dtype not in DTYPES:
        raise InvalidRequest("dtype", f"must be one of {', '.join(DTYPES)}; got {dtype!r}", dtype)
    dst = Path(dst)
    if dst.exists() and any(dst.iterdir()) and not overwrite:
        raise InvalidRequest("dst", f"{dst} exists and is not empty; pass overwrite=True (--force)", str(dst))
    g = read_gguf(src)
    tok = HfTokenizer.from_gguf_vocab(g.tokenizer, vocab_size=g.config.vocab_size, source=str(src))
    weights = dict(g.tensors())
    return save_hf(dst, g.config, weights, tok, chat_template=tok.chat_template, dtype=DTYPES[dtype])
