"""A Hugging Face directory loads into the same model as the GGUF it was made from.

The directory is written here from the embedded GGUF, truncated to two layers to stay small:
dequantized weights under HF names, q/k rows un-permuted back to the HF layout (llama.cpp's
converter permuted them), the tokenizer as tokenizer.json. Equal logits prove the HF name
mapping, the half-split rope on HF rows, and the tokenizer_config handling.
"""

from __future__ import annotations

import json

import attrs
import numpy as np
from ruvllm.models import ModelSource
from ruvllm_mlx.backend import MlxBackend
from ruvllm_mlx.gguf_loader import load_gguf
from ruvllm_mlx.layers import packed_bits
from ruvllm_mlx.mlx_core import mx
from ruvllm_mlx.model import Segment, Transformer

LAYERS = 2
HF_NAMES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj",
            "o": "self_attn.o_proj", "gate": "mlp.gate_proj", "up": "mlp.up_proj",
            "down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def dense(weights, name):
    w = weights[f"{name}.weight"]
    if f"{name}.scales" not in weights:
        return w.astype(mx.float32)
    s, b = weights[f"{name}.scales"], weights[f"{name}.biases"]
    return mx.dequantize(w, s, b, group_size=32, bits=packed_bits(w, s, 32)).astype(mx.float32)


def unpermute(w, heads):
    rows, cols = w.shape
    return w.reshape(heads, rows // heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def test_hf_directory_equals_gguf(tmp_path, model_path, backend):
    config, weights, _ = load_gguf(model_path)
    tensors = {"model.embed_tokens.weight": dense(weights, "embed"),
               "model.norm.weight": weights["norm.weight"]}
    for i in range(LAYERS):
        for ours, hf in HF_NAMES.items():
            w = dense(weights, f"layers.{i}.{ours}")
            if ours == "q":
                w = unpermute(w, config.num_heads)
            elif ours == "k":
                w = unpermute(w, config.num_kv_heads)
            tensors[f"model.layers.{i}.{hf}.weight"] = w
    mx.save_safetensors(str(tmp_path / "model.safetensors"), tensors)
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": config.hidden_size, "num_hidden_layers": LAYERS,
        "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
        "intermediate_size": config.intermediate_size, "vocab_size": config.vocab_size,
        "rms_norm_eps": config.rms_eps, "rope_theta": config.rope_theta,
        "max_position_embeddings": 2048, "tie_word_embeddings": True,
    }))
    backend.tokenizer.impl.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False,
        "chat_template": backend.info.chat_template,
    }))
    hf = MlxBackend.load(ModelSource.from_path(tmp_path), {})
    assert hf.info.architecture == "llama" and not hf.model.config.rope_traditional
    assert hf.info.special_tokens.eos_ids == (2,)
    text = "The capital of France is Paris, and 12 + 7 = 19."
    ids = hf.tokenizer.encode(text)
    assert ids == backend.tokenizer.encode(text)
    reference = Transformer(attrs.evolve(config, num_layers=LAYERS), weights,
                            mode="dequantized", dtype="float32")
    rows = list(range(len(ids)))
    a = np.array(hf.model.forward(ids, [Segment(hf.model.new_cache(), 0, len(ids))], rows))
    b = np.array(reference.forward(ids, [Segment(reference.new_cache(), 0, len(ids))], rows))
    np.testing.assert_allclose(a, b, atol=2e-3)
