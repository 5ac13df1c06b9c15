"""candle_like's claim to be ``auto``'s pick (ruvllm_candle_like.auto_claim): made exactly where
it was measured (a GGUF on its block kernel with int8 activations, on the AVX-512 kind with
VNNI) and nowhere else, asked without importing torch, and what ``auto`` then picks for the
embedded model. Whichever it picks, the default server's footprint is checked in
tests/llamacpp/test_llamacpp_footprint.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from ruvllm.gguf_file import read_gguf_file
from ruvllm.hardware import CpuInfo
from ruvllm.models import ModelSource
from ruvllm.plugins import get_registry
from ruvllm.registry import embedded_model_path
from ruvllm_candle_like import auto_claim, native


def _x86(*features: str) -> CpuInfo:
    return CpuInfo(arch="x86_64", model="emulated", features=frozenset(features), usable_cores=2,
                   logical_cores=2, memory_bytes=None)


AVX512_VNNI = _x86("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16")
AVX2_KIND = _x86("avx2", "fma", "f16c")
NO_VNNI = _x86("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16")
AMX_KIND = _x86("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile",
                "amx_bf16", "amx_int8")
built = pytest.mark.skipif(native.library_path() is None, reason="the native library was not built")


@pytest.fixture
def embedded() -> ModelSource:
    return ModelSource.from_path(embedded_model_path())


@built
def test_claimed_on_the_kind_it_was_measured_on(monkeypatch, embedded):
    monkeypatch.setattr(auto_claim, "cpu_info", lambda: AVX512_VNNI)
    assert auto_claim.fastest_here(embedded) == auto_claim.MEASURED


# The AVX2 kind: fastest there too, but its default server's footprint was not shown under the
# bound; AMX: not measured on these kernels; no VNNI: the int8 kernel cannot run.
@pytest.mark.parametrize("cpu", [AVX2_KIND, AMX_KIND, NO_VNNI], ids=["avx2", "amx", "no-vnni"])
def test_not_claimed_where_not_measured(monkeypatch, embedded, cpu):
    monkeypatch.setattr(auto_claim, "cpu_info", lambda: cpu)
    assert auto_claim.fastest_here(embedded) is None


@pytest.mark.parametrize("limit", ["AVX2", "AVX512_CORE"])
def test_not_claimed_on_an_emulated_cpu_without_vnni(monkeypatch, embedded, limit):
    """ONEDNN_MAX_CPU_ISA emulating an older CPU (ruvllm.hardware) takes the claim away as that
    CPU would: the AVX2 kind, or AVX-512 without VNNI, whatever this host has."""
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", limit)
    assert auto_claim.fastest_here(embedded) is None


def test_not_claimed_for_models_off_the_block_kernel(monkeypatch, tmp_path):
    monkeypatch.setattr(auto_claim, "cpu_info", lambda: AVX512_VNNI)
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


def test_ruvllm_backends_says_what_serve_would_pick_and_why(embedded, monkeypatch, tmp_path):
    """The fixed order alone would mislead where a claim (or a tune record) puts another backend
    first: the listing also says what `ruvllm serve` picks for the configured model, and why."""
    import json

    from click.testing import CliRunner
    from ruvllm.cli.app import main

    monkeypatch.setenv("RUVLLM_CACHE_DIR", str(tmp_path))  # no tune record
    out = CliRunner().invoke(main, ["backends", "--json"])
    assert out.exit_code == 0, out.output
    said = json.loads(out.output)["auto_for_serve"]
    assert said == str(get_registry().auto_choice(embedded, load=16, cache_dir=tmp_path))
    assert said.startswith("auto -> candle_like: candle_like claims" if auto_claim.fastest_here(embedded)
                           else "auto -> llamacpp")


def _gguf_with_projections(path, types: dict[str, str]) -> ModelSource:
    """A llama GGUF header whose layer-0 projections are of ``types`` (tensor -> GGUF type): all
    the claim reads."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint32("llama.attention.head_count", 4)
    w.add_uint32("llama.embedding_length", 256)
    for name in auto_claim.PROJECTION_TENSORS:
        qtype = gguf.GGMLQuantizationType[types.get(name, "Q4_K")]
        block, size = gguf.GGML_QUANT_SIZES[qtype]
        w.add_tensor(f"blk.0.{name}.weight", np.zeros((32, 256 // block * size), dtype=np.uint8),
                     raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return ModelSource.from_path(path)


@built
def test_claimed_for_a_q4_k_m_file_not_for_one_with_an_unmapped_type(monkeypatch, tmp_path):
    """Q4_K_M files mix Q4_K/Q5_0 with Q8_0 and Q6_K (re-quantised): measured faster than both
    of ruvllm's other CPU paths there. A Q3_K projection would run dense: no claim."""
    monkeypatch.setattr(auto_claim, "cpu_info", lambda: AVX512_VNNI)
    q4_k_m = {"attn_q": "Q5_0", "attn_v": "Q6_K", "ffn_down": "Q6_K", "attn_output": "Q8_0"}
    assert auto_claim.fastest_here(_gguf_with_projections(tmp_path / "m.gguf", q4_k_m)) == auto_claim.MEASURED
    q3 = _gguf_with_projections(tmp_path / "q3.gguf", {"attn_v": "Q3_K"})
    assert auto_claim.fastest_here(q3) is None


@built
def test_not_claimed_where_the_kernel_would_hold_much_more_than_the_file(monkeypatch, tmp_path):
    """Q6_K's 8-bit codes (and, a little, the K-quants' factors) take more bytes than the file:
    past EXTRA_WEIGHT_BYTES more (a 7B Q4_K_M: ~0.4 GiB) llamacpp keeps the model, at the file's
    size."""
    monkeypatch.setattr(auto_claim, "cpu_info", lambda: AVX512_VNNI)
    model = _gguf_with_projections(tmp_path / "m.gguf", {"attn_q": "Q5_0", "ffn_down": "Q6_K"})
    header = read_gguf_file(model.path)
    extra = auto_claim.extra_weight_bytes([t for t in header.tensors if t.name.startswith("blk.")])
    # Per 32 weights: Q4_K 18 bytes in the file, 18.5 held; Q5_0 22 -> 24; Q6_K 26.25 -> 36.
    assert extra == 32 * 256 * (5 * 0.5 + 2 + 9.75) // 32
    monkeypatch.setattr(auto_claim, "EXTRA_WEIGHT_BYTES", extra)
    assert auto_claim.fastest_here(model) == auto_claim.MEASURED
    monkeypatch.setattr(auto_claim, "EXTRA_WEIGHT_BYTES", extra - 1)
    assert auto_claim.fastest_here(model) is None
