"""The two-tier cache's ``migrate_tokens`` and ``max_kv_tokens`` on the ServingEngine's path (the one
``ruvllm serve`` uses), on the real backend and the embedded model: each changes what it says.

- ``migrate_tokens``: blocks leave a sequence's hot window in batches of ``migrate_tokens``
  (whole blocks), so a larger value keeps more tokens hot and migrates less often. Observed
  through the cache's own accounting (``PagedTwoTier.tiers``) after every engine step.
- ``max_kv_tokens``: the most positions one request may hold. The engine states it as the
  context (``engine.info.context_length``) and refuses a longer request (400 over HTTP) instead
  of evicting its oldest tokens as the request-level cache does; the pool is not shrunk.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from fastapi.testclient import TestClient
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import ContextLengthExceeded, InvalidRequest
from ruvllm.executor import BatchEntry
from ruvllm.server.app import ServerSettings, create_app
from ruvllm.testing.support import prompt_of_tokens
from ruvllm.types import FinishReason, GenerationParams

from .test_two_tier_executor import _variant

BLOCK = 16  # the engine's default block size
HOT = 32
PROMPT = 90  # 3 whole blocks older than the 32-token window after the prefill
NEW = 30
POOL = 1024


def _tiers_after_each_step(backend, migrate_tokens: int, prompt: list[int]) -> list[tuple[int, int, int]]:
    """(positions held, hot, cold) of the one running sequence after every step of a greedy
    request, read from the two-tier store between the engine's steps."""
    tiers = _variant(backend, kv_cache="two_tier", hot_tokens=HOT, migrate_tokens=migrate_tokens,
                     kv_cache_tokens=POOL)
    with ServingEngine(tiers, EngineOptions(max_num_seqs=2)) as engine:
        executor = engine._core.executor
        store = executor.two_tier
        assert store.migrate_blocks == migrate_tokens // BLOCK
        execute = executor.execute
        seen: list[tuple[int, int, int]] = []

        def spy(batch):
            out = execute(batch)
            (entry,) = batch
            end = entry.start_pos + len(entry.tokens)
            seen.append((end, *store.tiers(entry.block_table, end)))
            return out

        executor.execute = spy  # the engine calls the instance's execute
        result = engine.generate_sync([prompt], GenerationParams(max_tokens=NEW, ignore_eos=True))[0]
    assert result.finish_reason is FinishReason.LENGTH and len(result.token_ids) == NEW
    assert [s[0] for s in seen] == list(range(PROMPT, PROMPT + NEW)), "one prefill step, then decodes"
    return seen


def test_migrate_tokens_sets_how_many_tokens_stay_hot(backend_fp32):
    prompt = prompt_of_tokens(backend_fp32.tokenizer, PROMPT)
    steps = {m: _tiers_after_each_step(backend_fp32, m, prompt) for m in (16, 32)}
    for migrate, seen in steps.items():
        for end, hot, cold in seen:
            assert hot + cold == end
            # The last HOT positions are always hot; older ones leave in whole batches.
            assert cold % migrate == 0 and HOT <= hot < HOT + migrate, (migrate, end, hot, cold)
            assert cold == (end - HOT) // BLOCK * BLOCK // migrate * migrate
    one, two = steps[16], steps[32]
    # After the prefill (90 positions: 3 whole blocks older than the window): one block at a
    # time leaves 3 cold, batches of two leave 2.
    assert (one[0][1], two[0][1]) == (HOT + 10, HOT + 10 + BLOCK)
    assert max(h for _, h, _ in one) == HOT + BLOCK - 1 and max(h for _, h, _ in two) == HOT + 2 * BLOCK - 1
    # Migrations (steps where the cold count grew): every 16 tokens, or every 32.
    grew = {m: sum(b[2] > a[2] for a, b in itertools.pairwise(s)) for m, s in steps.items()}
    assert grew == {16: 2, 32: 1}, grew


def test_migrate_tokens_is_rounded_up_to_whole_blocks(backend_fp32):
    ex = _variant(backend_fp32, kv_cache="two_tier", hot_tokens=HOT, migrate_tokens=20,
                  kv_cache_tokens=POOL).create_executor(max_sequences=2, block_size=BLOCK)
    store = ex.two_tier
    assert store.migrate_blocks == 2 and "migrated 32 at a time" in ex.describe()
    # The hot pool holds every sequence's window plus a batch waiting to leave it.
    assert store.num_slots == 2 * ((HOT - 1) // BLOCK + 1 + 2)
    assert [store.cold_blocks(end) for end in (63, 64, 79, 80, 95, 96)] == [0, 2, 2, 2, 2, 4]


@pytest.fixture(scope="module")
def capped(backend_fp32):
    """An engine over a two-tier backend whose requests may hold at most 128 positions."""
    tiers = _variant(backend_fp32, kv_cache="two_tier", max_kv_tokens=128, kv_cache_tokens=POOL)
    with ServingEngine(tiers, EngineOptions(max_num_seqs=2)) as engine:
        yield engine


def test_max_kv_tokens_is_the_context_of_one_request(backend_fp32, capped):
    uncapped = _variant(backend_fp32, kv_cache="two_tier", kv_cache_tokens=POOL)
    with ServingEngine(uncapped, EngineOptions(max_num_seqs=2)) as engine:
        assert engine.info.context_length == POOL
    assert capped.info.context_length == 128
    assert capped.metrics().kv_capacity_tokens == POOL, "the pool is not what max_kv_tokens bounds"
    assert "at most 128 per sequence (max_kv_tokens)" in capped.backend.memory_summary()
    prompt = prompt_of_tokens(backend_fp32.tokenizer, 121)
    ok = capped.submit_sync(prompt[:120], GenerationParams(max_tokens=8, ignore_eos=True)).result(timeout=600)
    assert ok.finish_reason is FinishReason.LENGTH and ok.usage.total_tokens == 128
    with pytest.raises(ContextLengthExceeded) as err:
        capped.submit_sync(prompt, GenerationParams(max_tokens=8))
    assert err.value.context_length == 128 and "max_kv_tokens" in str(err.value), str(err.value)
    assert capped.metrics().kv_usage == 0.0


def test_executor_refuses_a_position_past_max_kv_tokens(backend_fp32):
    ex = _variant(backend_fp32, kv_cache="two_tier", max_kv_tokens=128,
                  kv_cache_tokens=POOL).create_executor(max_sequences=1, block_size=BLOCK)
    assert ex.max_seq_len == 128
    table = tuple(range(9))
    out = ex.execute([BatchEntry(seq_id=0, tokens=(1,) * 128, start_pos=0, block_table=table)])
    assert np.isfinite(out).all()
    with pytest.raises(InvalidRequest, match=r"position 128 is past the most positions of one sequence "
                                             r"\(max_kv_tokens\) 128"):
        ex.execute([BatchEntry(seq_id=0, tokens=(1,), start_pos=128, block_table=table)])


def test_serve_answers_400_past_max_kv_tokens(backend_fp32):
    """The server over that engine (``ruvllm serve -o kv_cache=two_tier -o max_kv_tokens=128``):
    400 for a request past the limit, naming it, and an answer within it."""
    tiers = _variant(backend_fp32, kv_cache="two_tier", max_kv_tokens=128, kv_cache_tokens=POOL)
    engine = ServingEngine(tiers, EngineOptions(max_num_seqs=2))  # the app's lifespan closes it
    prompt = prompt_of_tokens(backend_fp32.tokenizer, 121)
    with TestClient(create_app(engine, ServerSettings(model_name="smol"))) as client:
        r = client.post("/v1/completions", json={"model": "smol", "prompt": prompt, "max_tokens": 8})
        assert r.status_code == 400, r.text
        message = r.json()["error"]["message"]
        assert "one request may use 128 tokens" in message and "max_kv_tokens" in message, message
        r = client.post("/v1/completions", json={"model": "smol", "prompt": prompt[:120], "max_tokens": 8,
                                                 "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["total_tokens"] == 128
