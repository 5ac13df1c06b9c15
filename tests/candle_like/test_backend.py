"""Request-level contract: registration, isolation, options, the two-tier cache and convert."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from ruvllm.errors import BackendOptionError
from ruvllm.models import ModelSource
from ruvllm.options import parse_options
from ruvllm.plugins import load_registry
from ruvllm.types import GenerationParams
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.kv_contiguous import ContiguousCache
from ruvllm_candle_like.kv_two_tier import TwoTierCache, TwoTierSettings, dequantize, quantize
from ruvllm_candle_like.options import BackendOptions

GREEDY = GenerationParams(max_tokens=12)


def _greedy(backend, ids, n=12):
    gen = backend.generate(ids, GenerationParams(max_tokens=n))
    out = [t.token_id for _, t in zip(range(n), gen, strict=False)]
    gen.close()
    return out


def test_registered_through_the_entry_point():
    reg = load_registry()
    assert reg.get("candle_like") is CandleLikeBackend
    assert CandleLikeBackend.unavailable_reason() is None


def test_isolation_and_cached_tokens(backend_fp32):
    a = backend_fp32.tokenizer.encode("The capital of France is")
    b = backend_fp32.tokenizer.encode("Write a haiku about the sea")
    first = _greedy(backend_fp32, a)
    assert backend_fp32.cached_tokens() == 0
    _greedy(backend_fp32, b)
    assert _greedy(backend_fp32, a) == first
    assert backend_fp32.cached_tokens() == 0


@pytest.mark.parametrize(("options", "field", "hint"), [
    ({"kv_cache": "q3"}, "kv_cache", "one of fp16, two_tier"),
    ({"nonsense": 1}, "nonsense", "known options: cold_bits, compile_decode, context_length"),
    ({"device": "tpu"}, "device", "auto, cpu, cuda, cuda:N or mps"),
    ({"cold_bits": 3}, "cold_bits", "one of 4, 8"),
    ({"dtype": "fp64"}, "dtype", "one of auto, float32, fp32, bfloat16"),
    ({"hot_tokens": 0}, "hot_tokens", "integer >= 1"),
    ({"hot_tokens": 16, "migrate_tokens": 32}, "migrate_tokens", "<= hot_tokens (16)"),
])
def test_options_are_validated(options, field, hint):
    with pytest.raises(BackendOptionError) as err:
        parse_options(BackendOptions, "candle_like", options)
    assert (err.value.backend, err.value.option) == ("candle_like", field)
    assert f"backends.candle_like.{field}: " in str(err.value) and hint in str(err.value)


def test_float16_on_cpu_is_refused_naming_the_option():
    with pytest.raises(BackendOptionError, match=r"backends\.candle_like\.dtype: .*use auto, bfloat16 or "):
        BackendOptions(dtype="float16").resolve_dtype(torch.device("cpu"), "gguf")


def test_cold_quantisation_round_trip():
    import torch

    x = torch.randn(3, 50, 64)
    for bits, tol in ((8, 0.02), (4, 0.35)):
        p = quantize(x, bits, 64)
        assert p.codes.dtype == torch.uint8 and p.codes.shape == (3, 50, 64 * bits // 8)
        err = (dequantize(p, bits, 64, torch.float32) - x).abs().max().item()
        assert err < tol


@pytest.mark.slow
def test_two_tier_memory_and_agreement(backend_fp32):
    """At 2,000 tokens the Q4 two-tier cache takes >= 3x less memory than the 16-bit one, and
    greedy decoding right after agrees with it for the first tokens. Both are sized for the
    request, as ``new_cache(capacity)`` sizes them for ``generate``: without a capacity the
    cold store grows by doubling and may hold up to twice the tokens it needs."""
    cfg = backend_fp32.model.cfg
    sentence = "The history of the city begins with a small river port."
    text = backend_fp32.tokenizer.encode(" ".join([sentence] * 200))
    ids = [int(t) for t in text[:2000]]
    assert len(ids) == 2000, f"the corpus encodes to {len(text)} tokens, fewer than the 2000 compared"
    full = ContiguousCache(cfg, 2000, kv_dtype=torch.float16,
                           compute_dtype=backend_fp32.dtype, device=backend_fp32.device)
    tiers = TwoTierCache(cfg, TwoTierSettings(hot_tokens=64, migrate_tokens=32, bits=4, group_size=64,
                                              max_tokens=4096),
                         compute_dtype=backend_fp32.dtype, device=backend_fp32.device, capacity=2000)
    la = backend_fp32.step(full, ids)
    lb = backend_fp32.step(tiers, ids)
    assert tiers.length == 2000 and tiers.n_hot <= 64
    ratio = full.nbytes() / tiers.nbytes()
    print(f"KV bytes at 2000 tokens: fp16 {full.nbytes()} two-tier Q4 {tiers.nbytes()} ratio {ratio:.2f}")
    assert ratio >= 3.0
    assert int(la.argmax()) == int(lb.argmax())


def test_two_tier_eviction(backend_fp32):
    cfg = backend_fp32.model.cfg
    cache = TwoTierCache(cfg, TwoTierSettings(hot_tokens=16, migrate_tokens=8, bits=8, group_size=64,
                                              max_tokens=48),
                         compute_dtype=backend_fp32.dtype, device=backend_fp32.device)
    logits = backend_fp32.step(cache, list(range(100, 180)))
    assert np.isfinite(logits.numpy()).all()
    assert cache.length <= 48 and cache.evicted == 80 - cache.length and cache.position == 80


def test_convert_round_trip(backend_fp32, embedded_source, tmp_path_factory):
    from ruvllm_candle_like.convert import gguf_to_hf

    dst = gguf_to_hf(embedded_source.path, tmp_path_factory.mktemp("hf") / "smollm2")
    cfg = json.loads((dst / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    tcfg = json.loads((dst / "tokenizer_config.json").read_text())
    assert "<|im_start|>" in tcfg["chat_template"] and tcfg["eos_token"] == "<|im_end|>"
    hf = CandleLikeBackend.load(ModelSource.from_path(dst), {"dtype": "float32"})
    ids = backend_fp32.tokenizer.encode("The capital of France is")
    assert hf.tokenizer.encode("The capital of France is") == ids
    assert hf.info.chat_template == backend_fp32.info.chat_template
    assert _greedy(hf, ids, 16) == _greedy(backend_fp32, ids, 16)
    hf.close()
