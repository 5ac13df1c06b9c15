"""SONA trains in a dtype this CPU computes fast: a bf16 model on a CPU without native bf16
trains on a float32 copy (bf16's backward there falls to torch's slow reference gemm) while
the adapter it publishes stays in the served dtype; an explicit bf16 is honoured after one
warning naming the missing CPU feature.

A tiny random model and an inline engine keep this to milliseconds; the CPU is emulated by
patching ``cpu_info`` where candle_like and SONA read it.
"""

from __future__ import annotations

import concurrent.futures
import logging

import pytest
import torch
from ruvllm.errors import OptionError
from ruvllm.hardware import BF16_WITHOUT_NATIVE_COST, CpuInfo
from ruvllm.types import Trajectory
from ruvllm_candle_like.config import ModelConfig
from ruvllm_candle_like.lora import AdapterRegistry
from ruvllm_candle_like.model import Transformer
from ruvllm_sona.controller import Sona
from ruvllm_sona.options import SonaOptions
from ruvllm_sona.trainer import training_dtype

CPU = torch.device("cpu")
CFG = ModelConfig(model_type="llama", vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2,
                  num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64,
                  tie_word_embeddings=True)


def _x86(*features: str) -> CpuInfo:
    return CpuInfo(arch="x86_64", model="emulated", features=frozenset(features), usable_cores=2,
                   logical_cores=2, memory_bytes=None)


NATIVE = _x86("avx2", "avx512f", "avx512_bf16")
AVX2_ONLY = _x86("avx2", "fma")


def tiny_model(dtype: torch.dtype) -> Transformer:
    g = torch.Generator().manual_seed(0)
    h, kv, ff = CFG.hidden_size, CFG.num_kv_heads * CFG.head_dim, CFG.intermediate_size
    shapes = {"model.embed_tokens.weight": (CFG.vocab_size, h)}
    for i in range(CFG.num_layers):
        p = f"model.layers.{i}."
        shapes |= {p + "self_attn.q_proj.weight": (h, h), p + "self_attn.k_proj.weight": (kv, h),
                   p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, h),
                   p + "mlp.gate_proj.weight": (ff, h), p + "mlp.up_proj.weight": (ff, h),
                   p + "mlp.down_proj.weight": (h, ff)}
    weights = {name: torch.randn(shape, generator=g) * 0.2 for name, shape in shapes.items()}
    norms = ["model.norm.weight", *(f"model.layers.{i}.{n}_layernorm.weight" for i in range(CFG.num_layers)
                                    for n in ("input", "post_attention"))]
    weights |= {name: torch.ones(h) for name in norms}
    return Transformer(CFG, weights, dtype=dtype, device=CPU, max_positions=64, prepack=False)


class TinyBackend:
    """What SONA uses of CandleLikeBackend, around a tiny model."""

    name = "candle_like"
    embed = None  # only routing (apply="routed") and the deep loop embed prompts

    def __init__(self, model: Transformer):
        self.model = model
        self.adapters = AdapterRegistry()

    def publish_adapter(self, adapter) -> int:
        return self.adapters.publish(adapter)

    def unload_adapter(self, name: str) -> None:
        self.adapters.unload(name)

    def adapter_names(self) -> tuple[str, ...]:
        return self.adapters.names()


class InlineEngine:
    """Runs what SONA publishes at once (the ServingEngine runs it between two steps)."""

    def __init__(self, backend: TinyBackend):
        self.backend = backend

    def publish(self, fn) -> concurrent.futures.Future:
        done: concurrent.futures.Future = concurrent.futures.Future()
        done.set_result(fn())
        return done




@pytest.mark.parametrize(("info", "served", "trained"), [
    (AVX2_ONLY, torch.bfloat16, torch.float32), (NATIVE, torch.bfloat16, torch.bfloat16),
    (AVX2_ONLY, torch.float32, torch.float32), (NATIVE, torch.float32, torch.float32)])
def test_auto_never_trains_bf16_without_native_bf16(emulated_cpu, info, served, trained):
    emulated_cpu(info)
    assert training_dtype("auto", tiny_model(served)) == trained


def test_explicit_bf16_is_honoured_after_one_warning(emulated_cpu, caplog):
    emulated_cpu(AVX2_ONLY)
    model = tiny_model(torch.float32)
    with caplog.at_level(logging.WARNING):
        assert [training_dtype("bfloat16", model) for _ in range(2)] == [torch.bfloat16] * 2
    (record,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "avx512_bf16 or amx_bf16 missing" in record.getMessage()
    assert BF16_WITHOUT_NATIVE_COST in record.getMessage()


def test_float16_training_on_cpu_is_refused():
    with pytest.raises(OptionError, match=r"^sona\.dtype: float16"):
        training_dtype("float16", tiny_model(torch.float32))


def test_bf16_model_without_native_bf16_trains_a_float32_copy(emulated_cpu):
    emulated_cpu(AVX2_ONLY)
    backend = TinyBackend(tiny_model(torch.bfloat16))
    served_before = backend.model.layers[0].qkv.weight.clone()
    sona = Sona(InlineEngine(backend), SonaOptions(interval=0, steps_per_update=2, batch_size=2,
                                                   learning_rate=5e-2, ewc_lambda=1.0, fisher_batch=1))
    assert sona.model is not backend.model and sona.model.dtype == torch.float32
    for i in range(2):
        sona.on_finished(Trajectory(request_id=f"r{i}", prompt_ids=(3, 9, 27, 17), output_ids=(40, 41 + i)))
        sona.feedback(f"r{i}", 1.0)
    stats = sona.background_step()
    assert stats is not None and stats["update_norm"] > 0  # the float32 copy trained
    (name,) = backend.adapter_names()
    assert {p.a.dtype for p in backend.adapters.resolve(name).pairs.values()} == {torch.bfloat16}
    # The served model is untouched: the training copy holds its own weights.
    assert backend.model.dtype == torch.bfloat16
    assert torch.equal(backend.model.layers[0].qkv.weight, served_before)


@pytest.mark.parametrize(("info", "served", "lam"), [
    (AVX2_ONLY, torch.bfloat16, 3e4), (NATIVE, torch.bfloat16, 5e4), (NATIVE, torch.float32, 3e4)])
def test_auto_ewc_lambda_follows_the_training_dtype(emulated_cpu, info, served, lam):
    """Each training dtype gets the strength its own dev run chose (docs/sona.md): the dtype SONA
    trains in decides, not the one it serves in."""
    emulated_cpu(info)
    sona = Sona(InlineEngine(TinyBackend(tiny_model(served))), SonaOptions(interval=0))
    assert sona.learner().ewc.strength == lam


def test_an_explicit_ewc_lambda_holds_in_every_dtype(emulated_cpu):
    emulated_cpu(AVX2_ONLY)
    sona = Sona(InlineEngine(TinyBackend(tiny_model(torch.float32))), SonaOptions(interval=0, ewc_lambda=5e4))
    assert sona.learner().ewc.strength == 5e4


@pytest.mark.parametrize("value", ["strong", -1.0, True])
def test_a_bad_ewc_lambda_is_refused_by_name(value):
    with pytest.raises(OptionError, match=r"^sona\.ewc_lambda: must be one of auto or a number"):
        SonaOptions.from_mapping({"ewc_lambda": value})
