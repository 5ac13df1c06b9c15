"""Read a GGUF file into Hugging Face-named float tensors, a config and tokenizer metadata.

Every quantisation the ``gguf`` package can dequantise (Q4_0, Q4_1, Q8_0, the K-quants, F16,
F32...) is expanded to float32 here; the model then runs in the configured dtype. Asked for blocks,
the quantised projection matrices come as their GGUF blocks instead (rows un-permuted), for the
model to run as packed int4 (:mod:`ruvllm_candle_like.block_codes`) or dequantise. llama.cpp's
converter permutes the rows of ``attn_q``/``attn_k`` of Llama-architecture models so that its
interleaved ("normal") RoPE applies; we undo that permutation so one model implementation with
the Hugging Face (half-split) RoPE layout serves GGUF and HF weights alike. Qwen2 uses the
NeoX (half-split) layout in llama.cpp too, so its rows are stored unpermuted.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import numpy as np
from ruvllm.errors import ModelError, ModelLoadError
from ruvllm.gguf_file import GgufFile, read_gguf_file
from ruvllm.hf_tokenizer import GgufVocab

from ruvllm_candle_like.block_codes import GgufBlocks, dequantize
from ruvllm_candle_like.config import GGUF_ARCHITECTURES, ModelConfig

#: Architectures whose q/k rows llama.cpp's converter permuted.
PERMUTED_ARCHITECTURES = ("llama", "mistral")

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
#: Tensors llama.cpp stores that carry no weights we need.
_IGNORED = {"rope_freqs.weight"}


def hf_name(gguf_name: str) -> str | None:
    """The Hugging Face parameter name of a GGUF tensor, or None for tensors we do not use."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _LAYER_RE.match(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f"model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}"
    return None


def gguf_name(hf: str) -> str:
    """Inverse of :func:`hf_name` (used when tests write GGUF files)."""
    for g, h in _GLOBAL_NAMES.items():
        if h == hf:
            return g
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", hf)
    if m:
        for g, h in _LAYER_NAMES.items():
            if h == m.group(2):
                return f"blk.{m.group(1)}.{g}"
    raise KeyError(hf)


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's ``permute`` (convert_hf_to_gguf.py) of q/k projection rows (or biases).

    The converter maps each head's rows ``[x0..x_{d/2-1}, y0..y_{d/2-1}]`` (HF half-split
    RoPE pairs) to ``[x0, y0, x1, y1, ...]`` (interleaved pairs)."""
    shape = w.shape
    return w.reshape(n_head, shape[0] // n_head // 2, 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's converter permutation (HF half-split -> interleaved), for writing GGUF."""
    shape = w.shape
    return w.reshape(n_head, 2, shape[0] // n_head // 2, *shape[1:]).swapaxes(1, 2).reshape(shape)


@attrs.frozen(kw_only=True)
class GgufModel:
    config: ModelConfig
    tokenizer: GgufVocab
    #: Descriptive name from ``general.name``.
    name: str
    #: Most common weight quantisation (e.g. "Q4_1").
    quantization: str
    #: GGUF ``general.architecture``.
    architecture: str
    #: Frequency divisors of Llama 3.1-style RoPE scaling (``rope_freqs.weight``), if present.
    rope_freqs: np.ndarray | None
    file: GgufFile

    @property
    def path(self) -> Path:
        return self.file.path

    def tensors(self, *, blocks: bool = False) -> Iterator[tuple[str, np.ndarray | GgufBlocks]]:
        """(Hugging Face name, float32 array) for every weight, q/k rows un-permuted; with
        ``blocks``, the quantised projections' :class:`GgufBlocks` instead of float32."""
        yield from _read_tensors(self, blocks)


def read_gguf(path: str | Path) -> GgufModel:
    """Parse metadata (cheap: tensors are memory-mapped and read later by :meth:`tensors`)."""
    import gguf

    path = Path(path)
    try:
        f = read_gguf_file(path)
    except ModelError as exc:
        raise ModelLoadError(str(path), str(exc)) from None
    arch = f.get("general.architecture")
    if arch not in GGUF_ARCHITECTURES:
        raise ModelLoadError(
            str(path),
            f"GGUF architecture {arch!r} is not supported; candle_like runs "
            f"{', '.join(sorted(GGUF_ARCHITECTURES))}",
        )
    tokens = f.get("tokenizer.ggml.tokens")
    if not tokens:
        raise ModelLoadError(str(path), "the GGUF has no tokenizer.ggml.tokens; "
                             "re-convert it with a tokenizer")

    def a(key: str, default: Any = None) -> Any:
        return f.get(f"{arch}.{key}", default)

    by_name = {t.name: t for t in f.tensors}
    n_embd = int(a("embedding_length"))
    n_head = int(a("attention.head_count"))
    scaling = None
    stype = a("rope.scaling.type")
    if stype == "linear":
        scaling = {"rope_type": "linear", "factor": float(a("rope.scaling.factor"))}
    elif stype not in (None, "none"):
        raise ModelLoadError(str(path), f"RoPE scaling type {stype!r} is not supported (linear only)")
    rope_freqs = None
    if (t := by_name.get("rope_freqs.weight")) is not None:
        rope_freqs = np.array(gguf.quants.dequantize(f.tensor_data(t), t.type), dtype=np.float32)
    cfg = ModelConfig(
        model_type=GGUF_ARCHITECTURES[arch],
        vocab_size=int(a("vocab_size", len(tokens))),
        hidden_size=n_embd,
        intermediate_size=int(a("feed_forward_length")),
        num_layers=int(a("block_count")),
        num_heads=n_head,
        num_kv_heads=int(a("attention.head_count_kv", n_head)),
        head_dim=int(a("attention.key_length", n_embd // n_head)),
        rms_norm_eps=float(a("attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(a("rope.freq_base", 10000.0)),
        rope_scaling=scaling,
        max_position_embeddings=int(a("context_length", 2048)),
        tie_word_embeddings="output.weight" not in by_name,
        attention_bias="blk.0.attn_q.bias" in by_name,
        bos_token_id=f.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=f.get("tokenizer.ggml.eos_token_id"),
    )
    tok = GgufVocab.from_metadata({k: v for k, v in f.metadata.items() if k.startswith("tokenizer.")},
                                  str(path))
    quant = Counter(t.type_name for t in f.tensors if t.name.endswith("_proj.weight")
                    or ".attn_" in t.name or ".ffn_" in t.name).most_common(1)
    return GgufModel(
        config=cfg, tokenizer=tok, name=str(f.get("general.name", path.stem)),
        quantization=quant[0][0] if quant else "F32", architecture=arch, rope_freqs=rope_freqs, file=f,
    )


#: The tensors ``tensors(blocks=True)`` hands over as blocks: the projections and the head (the
#: token embedding, when tied).
BLOCK_TENSORS = ("_proj.weight", "lm_head.weight", "embed_tokens.weight")


def _read_tensors(model: GgufModel, blocks: bool) -> Iterator[tuple[str, np.ndarray | GgufBlocks]]:
    cfg = model.config
    permuted = model.architecture in PERMUTED_ARCHITECTURES
    for t in model.file.tensors:
        name = hf_name(t.name)
        if name is None:
            if t.name in _IGNORED:
                continue
            raise ModelLoadError(str(model.path), f"unexpected tensor {t.name!r} in the GGUF")
        heads = cfg.num_heads if ".q_proj." in name else cfg.num_kv_heads
        permute = permuted and (".self_attn.q_proj." in name or ".self_attn.k_proj." in name)
        if blocks and name.endswith(BLOCK_TENSORS) and t.type_name not in ("F32", "F16", "BF16"):
            # A row's blocks are its bytes, so un-permuting the rows of bytes un-permutes the weights.
            raw = model.file.tensor_data(t)
            yield name, GgufBlocks(t.type_name, t.type, unpermute_rows(raw, heads) if permute else raw,
                                   tuple(reversed(t.shape)))
            continue
        # GGUF shapes are reversed (ne0 first); dequantize already returns rows x cols.
        arr = dequantize(model.file.tensor_data(t), t.type, t.type_name, tuple(reversed(t.shape)),
                         source=str(model.path), tensor=f"tensor {t.name}")
        yield name, unpermute_rows(arr, heads) if permute else arr
