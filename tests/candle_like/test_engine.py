"""The executor driven by core's ServingEngine: concurrent requests, batched, give the same
greedy tokens as the request-level path, and every request is isolated."""

from __future__ import annotations

import ruvllm.engine as engine_mod
from ruvllm.types import GenerationParams


def test_engine_batches_through_the_executor(backend_fp32):
    params = GenerationParams(max_tokens=8)
    prompts = ["The capital of France is", "def add(a, b):", "Once upon a time", "List three colors:"]
    ids = [backend_fp32.tokenizer.encode(p) for p in prompts]
    expected = []
    for p in ids:
        gen = backend_fp32.generate(p, params)
        expected.append([t.token_id for _, t in zip(range(8), gen, strict=False)])
        gen.close()
    opts = engine_mod.EngineOptions(max_num_seqs=4, block_size=16, path="executor")
    with engine_mod.ServingEngine(backend_fp32, opts) as engine:
        assert engine.path == "executor"
        results = engine.generate_sync(ids, params)
        again = engine.generate_sync(ids[:1], params)
    for r, want in zip(results, expected, strict=True):
        assert list(r.token_ids)[: len(want)] == want[: len(r.token_ids)]
    assert list(again[0].token_ids) == list(results[0].token_ids)
