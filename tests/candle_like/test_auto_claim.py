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


DEFAULT_SERVE = """
import json, re
from ruvllm.config import load_config
from ruvllm.server.app import create_app
from ruvllm.server.runner import load_engine, settings_for
from ruvllm.types import GenerationParams

# What `ruvllm serve` does before uvicorn listens, with no configuration: auto's pick, its defaults.
config = load_config()
engine = load_engine(config)
create_app(engine, settings_for(config, engine))
engine.submit_sync(engine.tokenizer.encode("Hello"), GenerationParams(max_tokens=4)).result()
rss_kb = int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
print(json.dumps({"backend": engine.backend_name, "rss_mb": rss_kb / 1024}))
engine.close()
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads VmRSS from /proc")
def test_the_default_server_idles_under_the_small_machine_bound(tmp_path):
    """Whichever backend ``auto`` picks here, ``ruvllm serve`` with no configuration idles under
    500 MB resident after a request (the project's small-machine promise)."""
    import json

    out = subprocess.run([sys.executable, "-c", DEFAULT_SERVE], capture_output=True, text=True, timeout=300,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["rss_mb"] < 500, result
