"""How many bytes of KV cache a model needs per token, read from the model file itself.

The conformance suite's memory probe must not trust the backend under test (a backend that
leaks its KV may report anything), so the size of what a leak would keep is derived from the
model: ``layers x kv_heads x head_dim x 2 (K and V) x bytes per element``. The geometry comes
from the GGUF header or the Hugging Face ``config.json``, the same files every backend loads.

The GGUF header is read directly, stopping as soon as the attention geometry is known:
``gguf.GGUFReader`` parses every field and tensor of the file (20 s for the embedded model on
a busy 2-core machine), which a conformance fixture cannot afford.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, BinaryIO

import attrs

from ruvllm.errors import ModelError
from ruvllm.models import ModelSource

#: The narrowest KV element any backend of this project stores by default (float16/bfloat16).
#: A backend keeping float32 KV leaks twice as much per token; bounds derived with this value
#: are therefore the least a leak would add.
MIN_KV_BYTES_PER_ELEMENT = 2

_GGUF_MAGIC = b"GGUF"
#: GGUF value type -> struct format of one scalar (8: string, 9: array are handled apart).
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
           12: "<d"}
_STRING, _ARRAY = 8, 9


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
    wanted = ("block_count", "attention.head_count", "attention.head_count_kv", "embedding_length",
              "attention.key_length")
    try:
        with path.open("rb") as fh:
            values = _read_gguf_values(fh, wanted)
    except (OSError, struct.error, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: cannot read the GGUF header ({exc}); is it a GGUF file?") from None
    missing = [k for k in ("block_count", "attention.head_count", "embedding_length") if k not in values]
    if missing:
        raise ModelError(f"{path}: the GGUF header lacks {missing}: the KV size per token is unknown")
    heads = int(values["attention.head_count"])
    head_dim = int(values.get("attention.key_length") or int(values["embedding_length"]) // heads)
    return KvGeometry(int(values["block_count"]), int(values.get("attention.head_count_kv", heads)), head_dim)


def _read_gguf_values(fh: BinaryIO, wanted: tuple[str, ...]) -> dict[str, Any]:
    """``{suffix: value}`` of the ``<architecture>.<suffix>`` header keys listed in ``wanted``,
    reading only as far into the header as needed."""
    if fh.read(4) != _GGUF_MAGIC:
        raise ModelError(f"{fh.name}: not a GGUF file (bad magic)")
    (version,) = struct.unpack("<I", fh.read(4))
    if version < 2:
        raise ModelError(f"{fh.name}: GGUF version {version} is too old (need 2 or later)")
    _tensors, count = struct.unpack("<QQ", fh.read(16))
    arch: str | None = None
    found: dict[str, Any] = {}
    for _ in range(count):
        key = _read_string(fh)
        (vtype,) = struct.unpack("<I", fh.read(4))
        value = _read_value(fh, vtype)
        if key == "general.architecture":
            arch = str(value)
        elif arch is not None and key.startswith(arch + ".") and key[len(arch) + 1:] in wanted:
            found[key[len(arch) + 1:]] = value
            if len(found) == len(wanted):
                break
    return found


def _read_string(fh: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", fh.read(8))
    return fh.read(n).decode("utf-8")


def _read_value(fh: BinaryIO, vtype: int) -> Any:
    """One value; arrays are skipped (None): no geometry key is an array."""
    if vtype == _STRING:
        return _read_string(fh)
    if vtype == _ARRAY:
        etype, n = struct.unpack("<IQ", fh.read(12))
        if etype in _SCALAR:
            fh.seek(n * struct.calcsize(_SCALAR[etype]), 1)
        else:
            for _ in range(n):
                _read_value(fh, etype)
        return None
    fmt = _SCALAR.get(vtype)
    if fmt is None:
        raise ModelError(f"{fh.name}: unknown GGUF value type {vtype}")
    return struct.unpack(fmt, fh.read(struct.calcsize(fmt)))[0]


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
