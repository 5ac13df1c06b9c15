"""Load a model (weights, config, tokenizer, chat template) from a GGUF file or an HF directory."""

from __future__ import annotations

import json
from pathlib import Path

import attrs
import numpy as np
import torch
from ruvllm.errors import ModelLoadError
from ruvllm.hf_tokenizer import HfTokenizer
from ruvllm.models import ModelSource

from ruvllm_candle_like.config import ModelConfig
from ruvllm_candle_like.gguf_loader import read_gguf
from ruvllm_candle_like.model import Transformer, to_torch_weights


@attrs.define(kw_only=True)
class LoadedModel:
    config: ModelConfig
    model: Transformer
    tokenizer: HfTokenizer
    chat_template: str | None
    name: str
    quantization: str | None
    rope_freqs: np.ndarray | None = None


def read_hf_config(path: Path) -> ModelConfig:
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(str(path), "no config.json in the directory")
    try:
        raw = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelLoadError(str(cfg_path), f"config.json is not valid JSON: {exc}") from None
    return ModelConfig.from_hf(raw, str(cfg_path))


def hf_weights(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the directory's ``*.safetensors`` files, as float32."""
    from safetensors.torch import load_file

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(str(path), "no *.safetensors files in the directory")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        for name, t in load_file(str(f)).items():
            out[name] = t.float()
    return out


def load(source: ModelSource, *, dtype: torch.dtype, device: torch.device,
         context_length: int | None = None, prepack: bool = True, int4: bool = False,
         dense_rows: int | None = None, int8: bool = False) -> LoadedModel:
    """``int4``/``dense_rows``/``int8``: see :class:`~ruvllm_candle_like.model.Transformer` (GGUF only)."""
    path = Path(source.path)
    if not path.exists():
        raise ModelLoadError(str(path), "the path does not exist")
    if source.format == "gguf":
        g = read_gguf(path)
        cfg = g.config
        tok = HfTokenizer.from_gguf_vocab(g.tokenizer, vocab_size=cfg.vocab_size, source=str(path))
        weights = to_torch_weights(g.tensors(blocks=int4))
        ctx = context_length or cfg.max_position_embeddings
        model = Transformer(cfg, weights, dtype=dtype, device=device, max_positions=ctx,
                            rope_freqs=g.rope_freqs, prepack=prepack, int4=int4, dense_rows=dense_rows,
                            int8=int8)
        return LoadedModel(config=cfg, model=model, tokenizer=tok, chat_template=tok.chat_template,
                           name=g.name, quantization=g.quantization, rope_freqs=g.rope_freqs)
    cfg = read_hf_config(path)
    tok = HfTokenizer.from_hf_dir(path)
    ctx = context_length or cfg.max_position_embeddings
    model = Transformer(cfg, hf_weights(path), dtype=dtype, device=device, max_positions=ctx,
                        prepack=prepack)
    return LoadedModel(config=cfg, model=model, tokenizer=tok, chat_template=tok.chat_template,
                       name=source.name, quantization=None)
