"""candle_like's LoRA capability: adapters change generation, unloading restores the base model
exactly, the fused-qkv deltas equal merged weights, batched engine rows with different adapters
equal the request-level path, and PEFT directories round-trip."""

from __future__ import annotations

import json

import pytest
import ruvllm.engine as engine_mod
import torch
from ruvllm.errors import InvalidRequest
from ruvllm.types import GenerationParams
from ruvllm_candle_like.kv_contiguous import ContiguousCache
from ruvllm_candle_like.lora import LoraPlan, build_adapter, load_peft, projection_shapes
from ruvllm_candle_like.projection import Projection

from .conftest import pytorch_layers

PROMPT = "The capital of France is"
GREEDY = GenerationParams(max_tokens=12)


def random_adapter(backend, name: str, *, seed: int, rank: int = 4, targets=("q_proj", "v_proj"),
                   magnitude: float = 0.05):
    cfg = backend.model.cfg
    shapes = projection_shapes(cfg)
    g = torch.Generator().manual_seed(seed)
    weights = {}
    for layer in range(cfg.num_layers):
        for module in targets:
            out_f, in_f = shapes[module]
            a = torch.randn(rank, in_f, generator=g) * magnitude
            b = torch.randn(out_f, rank, generator=g) * magnitude
            weights[(layer, module)] = (a, b)
    return build_adapter(name, cfg, rank, 2.0 * rank, weights, dtype=backend.dtype, device=backend.device)


def greedy_ids(backend, prompt_ids, params=GREEDY):
    gen = backend.generate(prompt_ids, params)
    out = [t.token_id for _, t in zip(range(params.max_tokens), gen, strict=False)]
    gen.close()
    return out


def test_adapter_changes_output_and_unload_restores_base_exactly(backend_fp32):
    ids = backend_fp32.tokenizer.encode(PROMPT)
    base = greedy_ids(backend_fp32, ids)
    backend_fp32.publish_adapter(random_adapter(backend_fp32, "t-change", seed=1))
    try:
        tuned = greedy_ids(backend_fp32, ids, GenerationParams(max_tokens=12, adapter="t-change"))
        assert tuned != base
        # The base path is untouched while the adapter is loaded.
        assert greedy_ids(backend_fp32, ids) == base
    finally:
        backend_fp32.unload_adapter("t-change")
    assert greedy_ids(backend_fp32, ids) == base
    assert "t-change" not in backend_fp32.adapter_names()


def test_lora_deltas_equal_merged_weights(backend_fp32):
    """The q/k/v/o/gate/up/down deltas land on the right slices of the fused projections."""
    model = backend_fp32.model
    every_projection = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    adapter = random_adapter(backend_fp32, "t-merge", seed=2, rank=2, targets=every_projection)
    ids = torch.tensor(backend_fp32.tokenizer.encode(PROMPT))
    pos = torch.arange(len(ids))

    def logits(lora):
        cache = ContiguousCache(model.cfg, len(ids), kv_dtype=torch.float32, compute_dtype=model.dtype,
                                device=model.device)
        cache.begin(len(ids))
        with torch.inference_mode():
            return model.forward(ids, pos, cache, None, lora)

    # The slicing is what is tested here, on PyTorch's layers (test_native_decoder.py compares
    # the native decoder's LoRA hook with them): the merged model swaps projections.
    with pytorch_layers(model):
        with_lora = logits(LoraPlan([(adapter, None)]))
        merged = merged_logits(model, adapter, logits)
        base = logits(None)
    assert torch.allclose(with_lora, merged, atol=2e-3, rtol=1e-3)
    assert not torch.allclose(with_lora, base, atol=1e-2)


def merged_logits(model, adapter, logits):
    """``logits(None)`` with the adapter's deltas merged into the projections' weights."""
    site_attr = {"qkv": "qkv", "o": "o", "gate_up": "gate_up", "down": "down"}
    saved = [{name: getattr(layer, name) for name in site_attr.values()} for layer in model.layers]
    try:
        for (i, site), pairs in adapter.by_site().items():
            base = getattr(model.layers[i], site_attr[site])
            w = base.weight.clone()
            for p in pairs:
                lo, hi = p.cols
                w[lo:hi] += adapter.scale * (p.b @ p.a)
            setattr(model.layers[i], site_attr[site], Projection(w, base.bias))
        return logits(None)
    finally:
        for layer, orig in zip(model.layers, saved, strict=True):
            for name, t in orig.items():
                setattr(layer, name, t)


def test_engine_batches_adapter_and_base_rows_like_the_request_path(backend_fp32):
    backend_fp32.publish_adapter(random_adapter(backend_fp32, "t-a", seed=3))
    backend_fp32.publish_adapter(random_adapter(backend_fp32, "t-b", seed=4))
    try:
        prompts = [backend_fp32.tokenizer.encode(p) for p in
                   ("The capital of France is", "Once upon a time", "List three colors:")]
        jobs = [(prompts[0], "t-a"), (prompts[1], None), (prompts[2], "t-b"), (prompts[0], None),
                (prompts[1], "t-a")]
        expected = [greedy_ids(backend_fp32, ids, GenerationParams(max_tokens=10, adapter=a))
                    for ids, a in jobs]
        opts = engine_mod.EngineOptions(max_num_seqs=8, block_size=16, path="executor")
        with engine_mod.ServingEngine(backend_fp32, opts) as engine:
            handles = [engine.submit_sync(ids, GenerationParams(max_tokens=10, adapter=a)) for ids, a in jobs]
            got = [list(h.result().token_ids) for h in handles]
            with pytest.raises(InvalidRequest) as err:
                engine.submit_sync(prompts[0], GenerationParams(max_tokens=4, adapter="nope"))
            assert err.value.field == "adapter"
        assert got == expected
        assert expected[0] != expected[3]  # the adapter really changed that row
    finally:
        backend_fp32.unload_adapter("t-a")
        backend_fp32.unload_adapter("t-b")


def test_unknown_or_empty_adapter_is_refused():
    with pytest.raises(InvalidRequest) as err:
        GenerationParams(adapter="")
    assert err.value.field == "adapter"


def test_peft_directory_round_trips(backend_fp32, tmp_path):
    adapter = random_adapter(backend_fp32, "t-peft", seed=5, rank=2)
    out = adapter.save_peft(tmp_path / "peft", base_model="SmolLM2-135M-Instruct")
    conf = json.loads((out / "adapter_config.json").read_text())
    assert conf["r"] == 2 and conf["peft_type"] == "LORA" and conf["target_modules"] == ["q_proj", "v_proj"]
    from safetensors.torch import load_file

    keys = set(load_file(str(out / "adapter_model.safetensors")))
    assert "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" in keys
    assert "base_model.model.model.layers.29.self_attn.v_proj.lora_B.weight" in keys
    loaded = load_peft(out, "t-peft2", backend_fp32.model.cfg, dtype=backend_fp32.dtype,
                       device=backend_fp32.device)
    assert loaded.scale == adapter.scale
    for key, pair in adapter.pairs.items():
        assert torch.equal(pair.a, loaded.pairs[key].a) and torch.equal(pair.b, loaded.pairs[key].b)
    backend_fp32.load_adapter("t-peft", out)
    try:
        ids = backend_fp32.tokenizer.encode(PROMPT)
        backend_fp32.publish_adapter(adapter)
        direct = greedy_ids(backend_fp32, ids, GenerationParams(max_tokens=8, adapter="t-peft"))
        backend_fp32.load_adapter("t-peft", out)
        assert greedy_ids(backend_fp32, ids, GenerationParams(max_tokens=8, adapter="t-peft")) == direct
    finally:
        backend_fp32.unload_adapter("t-peft")


def test_capabilities_and_embeddings(backend_fp32):
    caps = backend_fp32.capabilities()
    assert caps.lora and caps.embeddings
    a = backend_fp32.embed(backend_fp32.tokenizer.encode("The cat sat on the mat."))
    b = backend_fp32.embed(backend_fp32.tokenizer.encode("A cat was sitting on a rug."))
    c = backend_fp32.embed(backend_fp32.tokenizer.encode("def main():\n    return 0"))
    assert a.shape == (backend_fp32.model.cfg.hidden_size,)

    def cos(x, y):
        return float((x @ y) / ((x @ x) ** 0.5 * (y @ y) ** 0.5))

    assert cos(a, b) > cos(a, c)
