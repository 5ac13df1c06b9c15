"""How many bytes of KV cache a model needs per token, read from the model file itself.

The conformance suite's memory probe must not trust the backend under test (a backend that
leaks its KV may report anything), so the size of what a leak would keep is derived from the
model: ``layers x kv_heads x head_dim x 2 (K and V) x bytes per element``. The geometry comes
from the GGUF header or the Hugging Face ``config.json``, the same files every backend loads.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from ruvllm.errors import ModelError
from ruvllm.gguf_file import read_gguf_file
from ruvllm.models import ModelSource

#: The narrowest KV element any backend of this project stores by default (float16/bfloat16).
#: A backend keeping float32 KV leaks twice as much per token; bounds derived with this value
#: are therefore the least a leak would add.
MIN_KV_BYTES_PER_ELEMENT = 2


@attrs.frozen
class KvGeometry:
    """The attention shape that decides a model's KV size per token."""

    layers: int = attrs.field(validator=attrs.validators.gt(0))
    kv_heads: int = attrs.field(validator=attrs.validators.gt(0))
    head_dim: int = attrs.field(validator=attrs.validators.gt(0))

    @property
    def elements_per_token(self) -> int:
        """K and V elements one token adds across all layers."""
        return 2 * self.layers * self.kv_heads * self.head_dim

    def bytes_per_token(self, bytes_per_element: int = MIN_KV_BYTES_PER_ELEMENT) -> int:
        return self.elements_per_token * bytes_per_element


def kv_geometry(source: ModelSource) -> KvGeometry:
    """The KV geometry of ``source`` (a GGUF file or a Hugging Face directory).

    Raises :class:`ModelError` when the file does not state it.
    """
    if source.format == "gguf":
        return _gguf_geometry(Path(source.path))
    return _hf_geometry(Path(source.path) / "config.json")


def _gguf_geometry(path: Path) -> KvGeometry:
    header = read_gguf_file(path)
    arch = header.get("general.architecture")
    values = {k.removeprefix(f"{arch}."): v for k, v in header.metadata.items() if k.startswith(f"{arch}.")}
    missing = [k for k in ("block_count", "attention.head_count", "embedding_length") if k not in values]
    if missing:
        raise ModelError(f"{path}: the GGUF header lacks {missing}: the KV size per token is unknown")
    heads = int(values["attention.head_count"])
    head_dim = int(values.get("attention.key_length") or int(values["embedding_length"]) // heads)
    return KvGeometry(int(values["block_count"]), int(values.get("attention.head_count_kv", heads)), head_dim)


def _hf_geometry(config: Path) -> KvGeometry:
    try:
        cfg = json.loads(config.read_text())
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        return KvGeometry(int(cfg["num_hidden_layers"]), int(cfg.get("num_key_value_heads") or heads),
                          head_dim)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelError(f"{config}: cannot read the attention geometry ({type(exc).__name__}: {exc})") \
            from None
