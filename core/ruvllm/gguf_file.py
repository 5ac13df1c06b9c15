"""A GGUF file's metadata and tensor directory, read in one pass over its header.

``gguf.GGUFReader`` builds a numpy view for every part of every field: about 500,000 of them
for the embedded SmolLM2's 49,152-token vocabulary and merges, 3.4 s per open of its 98 MB file
on a 2-core machine (candle_like opened it twice per load, mistral.rs and ``ruvllm models`` once
more). The header is a flat list of length-prefixed values: read here with ``struct`` (numeric
arrays with ``numpy.frombuffer``) in about 0.2 s. Tensor data stays memory-mapped, shaped as
``GGUFReader`` shapes it, so the ``gguf`` package still does every dequantisation.
"""

from __future__ import annotations

import functools
import mmap
import struct
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ruvllm.errors import ModelError

_MAGIC = b"GGUF"
#: GGUF value type -> struct format of one scalar (8: string and 9: array are read apart).
_SCALAR = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
           12: "<d"}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
          11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
#: ggml types stored as plain numpy elements; every other type is blocks of bytes.
_PLAIN = {0: np.float32, 1: np.float16, 24: np.int8, 25: np.int16, 26: np.int32, 27: np.int64,
          28: np.float64}
_DEFAULT_ALIGNMENT = 32


@attrs.frozen
class GgufTensor:
    name: str
    #: GGUF order: ``ne0`` (the contiguous dimension) first.
    shape: tuple[int, ...]
    #: ``gguf.GGMLQuantizationType`` value.
    type: int
    #: Absolute byte offset of the data in the file.
    offset: int

    @property
    def n_elements(self) -> int:
        return int(np.prod(self.shape))

    @property
    def type_name(self) -> str:
        from gguf import GGMLQuantizationType

        return GGMLQuantizationType(self.type).name


@attrs.frozen
class GgufFile:
    path: Path
    version: int
    #: Every header key: scalars as Python values, arrays as lists (``GGUFReader``'s ``contents()``).
    metadata: dict[str, Any]
    tensors: tuple[GgufTensor, ...]

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def parameters(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    @property
    def file_type(self) -> str | None:
        """llama.cpp's name of ``general.file_type`` (``Q4_1``...; None when the file does not
        say): how the file was quantised as a whole."""
        from gguf import LlamaFileType

        ftype = self.get("general.file_type")
        if ftype is None:
            return None
        try:
            return LlamaFileType(int(ftype)).name.removeprefix("MOSTLY_")
        except ValueError:
            return f"file_type {ftype}"

    @functools.cached_property
    def _data(self) -> np.memmap:
        """The whole file, mapped once for every tensor read (pages load as they are touched)."""
        return np.memmap(self.path, mode="r")

    def tensor_data(self, tensor: GgufTensor) -> np.ndarray:
        """The tensor's stored values, memory-mapped, as ``GGUFReader`` gives them to
        ``gguf.quants.dequantize``: elements for plain types, rows of block bytes otherwise."""
        from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
        from gguf.quants import quant_shape_to_byte_shape

        rows_first = tuple(reversed(tensor.shape))
        data = self._data
        if tensor.type in _PLAIN:
            dtype = np.dtype(_PLAIN[tensor.type])
            return data[tensor.offset:tensor.offset + tensor.n_elements * dtype.itemsize] \
                .view(dtype).reshape(rows_first)
        qtype = GGMLQuantizationType(tensor.type)
        block, size = GGML_QUANT_SIZES[qtype]
        n_bytes = tensor.n_elements * size // block
        rows = data[tensor.offset:tensor.offset + n_bytes]
        return rows.reshape(quant_shape_to_byte_shape(rows_first, qtype))


def read_gguf_file(path: str | Path) -> GgufFile:
    """Parse ``path``'s header; raises :class:`ModelError` naming what is wrong with it."""
    path = Path(path)
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _Header(buf, path).read()
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise ModelError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None


class _Header:
    """A cursor over the header bytes."""

    def __init__(self, buf: mmap.mmap, path: Path) -> None:
        self.buf, self.path, self.at = buf, path, 0

    def _unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from(fmt, self.buf, self.at)
        self.at += struct.calcsize(fmt)
        return value

    def _string(self) -> str:
        n = self._unpack("<Q")
        self.at += n
        return self.buf[self.at - n:self.at].decode("utf-8")

    def _value(self, vtype: int) -> Any:
        if vtype == _STRING:
            return self._string()
        if vtype == _ARRAY:
            etype, n = self._unpack("<I"), self._unpack("<Q")
            if etype in _NUMPY:
                arr = np.frombuffer(self.buf, dtype=_NUMPY[etype], count=n, offset=self.at)
                self.at += arr.nbytes
                return arr.tolist()
            return [self._value(etype) for _ in range(n)]
        fmt = _SCALAR.get(vtype)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {vtype} at byte {self.at}")
        return self._unpack(fmt)

    def read(self) -> GgufFile:
        if self.buf[:4] != _MAGIC:
            head = self.buf[:4]
            raise ModelError(f"{self.path}: not a GGUF file (it starts with {head!r}, not {_MAGIC!r})")
        self.at = 4
        version = self._unpack("<I")
        if not 2 <= version < 1 << 16:
            raise ModelError(f"{self.path}: GGUF version {version} is not readable here (need 2 or later, "
                             "little-endian)")
        n_tensors, n_kv = self._unpack("<Q"), self._unpack("<Q")
        metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = self._string()
            metadata[key] = self._value(self._unpack("<I"))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = tuple(self._unpack("<Q") for _ in range(self._unpack("<I")))
            infos.append((name, dims, self._unpack("<I"), self._unpack("<Q")))
        align = int(metadata.get("general.alignment", _DEFAULT_ALIGNMENT))
        start = -(-self.at // align) * align
        return GgufFile(self.path, version, metadata,
                        tuple(GgufTensor(name, dims, ttype, start + off) for name, dims, ttype, off in infos))
