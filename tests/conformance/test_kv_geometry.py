"""The KV size the memory probe's bound is derived from, read from the model files themselves."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ruvllm.errors import ModelError
from ruvllm.models import ModelSource
from ruvllm.registry import embedded_model_path
from ruvllm.testing.kv_geometry import KvGeometry, kv_geometry


def test_embedded_gguf_geometry() -> None:
    """SmolLM2-135M: 30 layers, 3 KV heads of 64 (576 / 9 heads): 23,040 bytes per token at 16 bits."""
    geometry = kv_geometry(ModelSource.from_path(embedded_model_path()))
    assert geometry == KvGeometry(layers=30, kv_heads=3, head_dim=64)
    assert geometry.bytes_per_token() == 23_040
    assert geometry.bytes_per_token(4) == 46_080


def test_hf_config_geometry(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 256,
    }))
    assert kv_geometry(ModelSource(name="x", path=tmp_path, format="hf")) == KvGeometry(4, 2, 32)


def test_unreadable_files_raise_model_error(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOTAGGUF" * 4)
    with pytest.raises(ModelError, match="not a GGUF file"):
        kv_geometry(ModelSource(name="bad", path=bad, format="gguf"))
    with pytest.raises(ModelError, match=r"config\.json"):
        kv_geometry(ModelSource(name="none", path=tmp_path, format="hf"))


#: Run in a fresh interpreter: the probe reads every arena of the process, and under xdist a
#: worker's other threads (a session server's engine) free memory while the test allocates.
_HEAP_PROBE = """
import numpy as np
from ruvllm.testing.memory_probe import heap_in_use_bytes
before = heap_in_use_bytes()
if before is None:
    print("unreadable")
else:
    kept = [np.ones(16_000, np.uint8) for _ in range(1000)]  # 16 MB in heap-sized chunks
    print(heap_in_use_bytes() - before)
"""


def test_heap_probe_sees_allocations_the_resident_set_may_not() -> None:
    pytest.importorskip("numpy")
    out = subprocess.run([sys.executable, "-c", _HEAP_PROBE], capture_output=True, text=True,
                         check=True, timeout=120).stdout.strip()
    if out == "unreadable":
        pytest.skip("the C allocator cannot be asked here (not glibc)")
    assert 15_000_000 < int(out) < 40_000_000, out
