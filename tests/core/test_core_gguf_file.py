"""ruvllm.gguf_file reads what the ``gguf`` package's reader reads, and says what is wrong otherwise.

The reference is ``gguf.GGUFReader`` on the embedded model (every header key, every tensor's
name, shape, type, offset and stored bytes) and on a file the ``gguf`` package writes with
every value type the format has.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
from ruvllm.errors import ModelError
from ruvllm.gguf_file import read_gguf_file
from ruvllm.registry import embedded_model_path


def _assert_reads_like_gguf_reader(path: Path) -> None:
    ours, ref = read_gguf_file(path), gguf.GGUFReader(path)
    fields = {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
    assert ours.metadata == fields
    assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
    for mine, theirs in zip(ours.tensors, ref.tensors, strict=True):
        assert mine.shape == tuple(theirs.shape.tolist()) and mine.type == theirs.tensor_type
        assert mine.offset == theirs.data_offset
        data = ours.tensor_data(mine)
        assert data.dtype == theirs.data.dtype and data.shape == theirs.data.shape
        assert np.array_equal(data, theirs.data), mine.name
    assert ours.parameters == sum(int(t.n_elements) for t in ref.tensors)


def test_embedded_model_reads_like_gguf_reader() -> None:
    path = embedded_model_path()
    _assert_reads_like_gguf_reader(path)
    f = read_gguf_file(path)
    assert f.file_type == "Q4_1" and f.get("general.architecture") == "llama"


def test_every_value_type_and_plain_tensor_reads_like_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "all.gguf"
    w = gguf.GGUFWriter(path, "llama")
    w.add_uint8("t.u8", 250)
    w.add_int8("t.i8", -5)
    w.add_uint16("t.u16", 65000)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -70000)
    w.add_float32("t.f32", 0.25)
    w.add_uint64("t.u64", 2**40)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 1e-300)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo")
    w.add_array("t.ints", [1, 2, 3])
    w.add_array("t.strs", ["a", "", "ü"])
    w.add_custom_alignment(64)
    w.add_tensor("f32", np.arange(12, dtype=np.float32).reshape(3, 4))
    w.add_tensor("f16", np.arange(6, dtype=np.float16).reshape(2, 3))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _assert_reads_like_gguf_reader(path)
    f = read_gguf_file(path)
    assert f.get("t.strs") == ["a", "", "ü"] and f.get("t.bool") is True
    np.testing.assert_array_equal(f.tensor_data(f.tensors[0]), np.arange(12, dtype=np.float32).reshape(3, 4))


@pytest.mark.parametrize(("content", "says"), [
    (b"NOTAGGUF" * 4, "not a GGUF file (it starts with b'NOTA'"),
    (b"", "not a readable GGUF file"),
    (b"GGUF\x03\x00\x00\x00" + (1).to_bytes(8, "little") + (1).to_bytes(8, "little") + b"\x05",
     "not a readable GGUF file"),
    (b"GGUF" + (1 << 24).to_bytes(4, "little") + bytes(16), "GGUF version 16777216 is not readable"),
])
def test_broken_files_are_model_errors_naming_the_file(tmp_path: Path, content: bytes, says: str) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(content)
    with pytest.raises(ModelError, match=r"bad\.gguf") as err:
        read_gguf_file(bad)
    assert says in str(err.value)
