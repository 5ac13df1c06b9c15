"""Write models: a Hugging Face directory (``ruvllm convert``) or an F32/F16 GGUF file.

The GGUF writer mirrors llama.cpp's converter (including its q/k row permutation for the Llama
architecture), so a file it writes loads in llama.cpp and round-trips through our loader; the
tests use it to build tiny random models in both formats.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from ruvllm.hf_tokenizer import GgufVocab, HfTokenizer

from ruvllm_candle_like.config import ModelConfig
from ruvllm_candle_like.gguf_loader import PERMUTED_ARCHITECTURES, gguf_name, permute_rows


def save_hf(dst: str | Path, cfg: ModelConfig, weights: Mapping[str, np.ndarray | torch.Tensor],
            tokenizer: HfTokenizer, *, chat_template: str | None, dtype: torch.dtype = torch.float32,
            bos_text: str | None = None, eos_text: str | None = None) -> Path:
    """A standard Hugging Face model directory: config.json, model.safetensors, tokenizer.json,
    tokenizer_config.json (with the chat template), generation_config.json."""
    from safetensors.torch import save_file

    dst = Path(dst)
    dst.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for name, arr in weights.items():
        t = arr if isinstance(arr, torch.Tensor) else torch.from_numpy(np.require(arr, requirements="CW"))
        if cfg.tie_word_embeddings and name == "lm_head.weight":
            continue
        tensors[name] = t.to(dtype).contiguous()
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    config = cfg.to_hf()
    config["torch_dtype"] = str(dtype).removeprefix("torch.")
    (dst / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    tokenizer.impl.save(str(dst / "tokenizer.json"))
    eos_ids = list(tokenizer.eos_ids)
    tcfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": cfg.max_position_embeddings,
        "add_bos_token": tokenizer.add_bos,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "bos_token": bos_text if bos_text is not None else (
            tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else None),
        "eos_token": eos_text if eos_text is not None else (
            tokenizer.token_text(eos_ids[0]) if eos_ids else None),
    }
    if chat_template:
        tcfg["chat_template"] = chat_template
    (dst / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2, ensure_ascii=False) + "\n")
    gen = {"_from_model_config": True, "bos_token_id": tokenizer.bos_id,
           "eos_token_id": eos_ids[0] if len(eos_ids) == 1 else eos_ids}
    (dst / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    return dst


def write_gguf(path: str | Path, cfg: ModelConfig, weights: Mapping[str, np.ndarray],
               tok: GgufVocab, *, f16: bool = False, name: str = "ruvllm-test") -> Path:
    """Write an F32 (or F16 for 2-D weights) GGUF as llama.cpp's converter would."""
    import gguf

    arch = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2"}[cfg.model_type]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(name)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_file_type(1 if f16 else 0)
    w.add_tokenizer_model(tok.model)
    w.add_tokenizer_pre(tok.pre)
    w.add_token_list(tok.tokens)
    w.add_token_types(tok.token_types)
    if tok.merges:
        w.add_token_merges(tok.merges)
    if tok.scores is not None:
        w.add_token_scores(tok.scores)
    if tok.bos_id is not None:
        w.add_bos_token_id(tok.bos_id)
    if tok.eos_id is not None:
        w.add_eos_token_id(tok.eos_id)
    w.add_add_bos_token(tok.add_bos)
    if tok.chat_template:
        w.add_chat_template(tok.chat_template)
    permuted = arch in PERMUTED_ARCHITECTURES
    for hf, arr in weights.items():
        if cfg.tie_word_embeddings and hf == "lm_head.weight":
            continue
        a = np.asarray(arr, dtype=np.float32)
        if permuted and ".self_attn.q_proj." in hf:
            a = permute_rows(a, cfg.num_heads)
        elif permuted and ".self_attn.k_proj." in hf:
            a = permute_rows(a, cfg.num_kv_heads)
        if f16 and a.ndim == 2:
            a = a.astype(np.float16)
        w.add_tensor(gguf_name(hf), np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return Path(path)
