"""``dtype = "auto"`` follows what this CPU computes fast, and a bf16 it cannot compute natively
is said once, never silently: as a warning naming the missing feature and the cost, and (with
the weights oneDNN then cannot pack) in the backend's capabilities notes.

The CPU is emulated by patching ``cpu_info`` where candle_like reads it, so both kinds of
machine are tested on either; oneDNN's own refusal to pack is patched the same way.
"""

from __future__ import annotations

import logging

import pytest
import torch
from ruvllm.hardware import BF16_WITHOUT_NATIVE_COST, CpuInfo
from ruvllm.models import ModelSource
from ruvllm_candle_like import blockmm, projection
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.options import BackendOptions

from .tiny import write_tiny

CPU = torch.device("cpu")


def _x86(*features: str, onednn_isa_limit: str | None = None) -> CpuInfo:
    return CpuInfo(arch="x86_64", model="emulated", features=frozenset(features), usable_cores=2,
                   logical_cores=2, memory_bytes=None, onednn_isa_limit=onednn_isa_limit)


AVX512_BF16 = _x86("avx2", "fma", "avx512f", "avx512_bf16")
AVX2_ONLY = _x86("avx2", "fma")
AMX = _x86("avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
#: AVX-512 bf16 in the CPU, masked the way CI emulates an older machine.
MASKED = _x86("avx2", "fma", "avx512f", "avx512_bf16", onednn_isa_limit="AVX2")
#: What oneDNN says on an AVX2-only CPU when asked to pack a bf16 weight.
ONEDNN_REFUSAL = "bf16 path needs the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"




def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.parametrize(("info", "expected"), [
    (AVX512_BF16, torch.bfloat16), (AVX2_ONLY, torch.float32), (MASKED, torch.float32)])
def test_auto_computes_in_bf16_only_where_it_is_native(emulated_cpu, info, expected):
    emulated_cpu(info)
    assert BackendOptions().resolve_dtype(CPU, "hf") == expected
    # GPUs are not asked about: auto stays float16 there.
    assert BackendOptions().resolve_dtype(torch.device("cuda"), "gguf") == torch.float16


@pytest.mark.parametrize(("options", "expected"), [
    ({}, torch.float32), ({"int8_activations": False}, torch.bfloat16),
    ({"int4_weights": False}, torch.bfloat16)])
def test_a_gguf_on_the_int8_kernel_computes_in_float32_between_kernels(emulated_cpu, monkeypatch, options,
                                                                       expected):
    """Where the GGUF's blocks run on the int8-activation kernel, its integer products beat bf16
    dense matmuls even with native bf16 (docs/backends/candle_like.md), so auto keeps the blocks."""
    emulated_cpu(AVX512_BF16)
    monkeypatch.setattr(blockmm, "int8_by_default", lambda: True)
    assert BackendOptions(**options).resolve_dtype(CPU, "gguf") == expected
    assert BackendOptions().resolve_dtype(CPU, "hf") == torch.bfloat16
    monkeypatch.setattr(blockmm, "int8_by_default", lambda: False)  # no block kernel
    assert BackendOptions().resolve_dtype(CPU, "gguf") == torch.bfloat16
    # The AMX kind keeps bf16 on its tiles: not measured against the int8 kernel.
    emulated_cpu(AMX)
    monkeypatch.setattr(blockmm, "int8_by_default", lambda: True)
    assert BackendOptions().resolve_dtype(CPU, "gguf") == torch.bfloat16


@pytest.mark.parametrize(("info", "named"), [
    (AVX2_ONLY, "avx512_bf16 or amx_bf16 missing"), (MASKED, "ONEDNN_MAX_CPU_ISA=AVX2 masks")])
def test_explicit_bf16_without_native_bf16_warns_once_naming_the_feature(emulated_cpu, caplog, info, named):
    emulated_cpu(info)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):  # a process loading the backend again is not warned again
            assert BackendOptions(dtype="bfloat16").resolve_dtype(CPU, "hf") == torch.bfloat16
    (message,) = _warnings(caplog)
    assert named in message and BF16_WITHOUT_NATIVE_COST in message and "dtype=auto" in message


def test_explicit_bf16_with_native_bf16_and_float32_anywhere_are_silent(emulated_cpu, caplog):
    with caplog.at_level(logging.WARNING):
        emulated_cpu(AVX512_BF16)
        BackendOptions(dtype="bfloat16").resolve_dtype(CPU, "hf")
        emulated_cpu(AVX2_ONLY)
        BackendOptions(dtype="float32").resolve_dtype(CPU, "hf")
    assert _warnings(caplog) == []


def test_capabilities_note_what_this_cpu_changes(emulated_cpu, monkeypatch):
    emulated_cpu(AVX512_BF16)
    monkeypatch.setattr(projection, "packing_unavailable", lambda dtype: None)
    assert CandleLikeBackend.capabilities().notes == ()
    emulated_cpu(AVX2_ONLY)
    monkeypatch.setattr(projection, "packing_unavailable",
                        lambda dtype: ONEDNN_REFUSAL if dtype == torch.bfloat16 else None)
    notes = CandleLikeBackend.capabilities().notes
    assert any("dtype=auto computes in float32" in n and "avx512_bf16 or amx_bf16 missing" in n
               for n in notes)
    assert any("prepack_weights has no effect for bfloat16" in n and ONEDNN_REFUSAL in n for n in notes)
    assert not any("for float32" in n for n in notes)


def test_bf16_load_without_packing_says_so_once_and_still_runs(emulated_cpu, monkeypatch, caplog, tmp_path):
    """Where oneDNN packs no bf16 weights, every projection takes the plain matmul; the load
    warns once about the dtype and once about the packing, however often it is repeated."""
    emulated_cpu(AVX2_ONLY)
    monkeypatch.setattr(projection, "packing_unavailable",
                        lambda dtype: ONEDNN_REFUSAL if dtype == torch.bfloat16 else None)
    gguf_path, _, cfg = write_tiny("llama", tmp_path)
    with caplog.at_level(logging.WARNING):
        backends = [CandleLikeBackend.load(ModelSource.from_path(gguf_path), {"dtype": "bfloat16"})
                    for _ in range(2)]
    warned = _warnings(caplog)
    assert len(warned) == 2, warned
    assert any("dtype=bfloat16 was asked for" in w for w in warned)
    assert any("prepack_weights has no effect for bfloat16" in w and ONEDNN_REFUSAL in w for w in warned)
    model = backends[0].model
    assert model.dtype == torch.bfloat16
    projections = [model.lm_head, *(p for la in model.layers for p in (la.qkv, la.o, la.gate_up, la.down))]
    assert all(p.packed is None for p in projections)
    cache = backends[0].new_cache(4)
    logits = backends[0].step(cache, [1, 40, 77, 90])
    assert logits.shape == (cfg.vocab_size,) and torch.isfinite(logits).all()
    for b in backends:
        b.close()
