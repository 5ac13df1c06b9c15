"""candle_like's claim to be ``auto``'s pick (ruvllm_candle_like.auto_claim): made exactly where
it was measured (a GGUF on its block kernel, float32 layers on an AVX2/FMA/F16C CPU) and
nowhere else, asked without importing torch, and what ``auto`` then picks for the embedded model.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from ruvllm.hardware import CpuInfo
from ruvllm.models import ModelSource
from ruvllm.plugins import get_registry
from ruvllm.registry import embedded_model_path
from ruvllm_candle_like import auto_claim, native


def _x86(*features: str) -> CpuInfo:
    return CpuInfo(arch="x86_64", model="emulated", features=frozenset(features), usable_cores=2,
                   logical_cores=2, memory_bytes=None)


AVX2_KIND = _x86("avx2", "fma", "f16c")
BF16_KIND = _x86("avx2", "fma", "f16c", "avx512f", "avx512_bf16")
NO_F16C = _x86("avx2", "fma")
built = pytest.mark.skipif(native.library_path() is None, reason="the native library was not built")


@pytest.fixture
def embedded() -> ModelSource:
    return ModelSource.from_path(embedded_model_path())


@built
def test_claimed_on_the_kind_it_was_measured_on(monkeypatch, embedded):
    monkeypatch.setattr(auto_claim, "cpu_info", lambda: AVX2_KIND)
    assert auto_claim.fastest_here(embedded) == auto_claim.MEASURED


@pytest.mark.parametrize("cpu", [BF16_KIND, NO_F16C], ids=["native-bf16", "no-f16c"])
def test_not_claimed_where_not_measured(monkeypatch, embedded, cpu):
    monkeypatch.setattr(auto_claim, "cpu_info", lambda: cpu)
    assert auto_claim.fastest_here(embedded) is None


def test_not_claimed_for_models_off_the_block_kernel(monkeypatch, tmp_path):
    monkeypatch.setattr(auto_claim, "cpu_info", lambda: AVX2_KIND)
    assert auto_claim.fastest_here(ModelSource.from_path(tmp_path)) is None  # a Hugging Face directory
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF not really")
    assert auto_claim.fastest_here(ModelSource.from_path(broken)) is None  # the loader says why


def test_auto_picks_by_the_claim_for_the_embedded_model(embedded):
    registry = get_registry()
    if not {"llamacpp", "candle_like"} <= set(registry.backends):
        pytest.skip("needs the llamacpp and candle_like backends installed")
    expected = "candle_like" if auto_claim.fastest_here(embedded) else "llamacpp"
    assert registry.auto_choice(embedded).name == expected


def test_asking_imports_no_torch(embedded):
    code = ("import sys\nfrom ruvllm.models import ModelSource\nfrom ruvllm.plugins import get_registry\n"
            f"get_registry().backends['candle_like'].fastest_here(ModelSource.from_path({str(embedded)!r}))\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
