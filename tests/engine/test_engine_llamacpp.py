"""The ServingEngine on the real llama.cpp executor and the embedded model."""

from __future__ import annotations

import pytest
from ruvllm.config import default_cache_dir
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.generation import GenerationStream, RequestOutputBuilder
from ruvllm.registry import resolve
from ruvllm.types import GenerationParams

ruvllm_llamacpp = pytest.importorskip("ruvllm_llamacpp")

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time",
           "List of prime numbers: 2, 3, 5,")
LONG = ("The river bends twice before it reaches the old stone bridge near the market. "
        "Engineers measured the load on each beam and wrote the numbers down. In winter")


@pytest.fixture(scope="module")
def backend():
    reason = ruvllm_llamacpp.LlamaCppBackend.unavailable_reason()
    if reason:
        pytest.skip(reason)
    # One thread: the shared 2-core test machine makes OpenMP's spinning threads crawl.
    b = ruvllm_llamacpp.LlamaCppBackend.load(resolve("default", default_cache_dir()),
                                             {"n_ctx": 256, "n_threads": 1})
    yield b
    b.close()


def alone(backend, ids, params):
    """Request-level reference: the backend's own generate(), one request at a time."""
    builder = RequestOutputBuilder(backend.tokenizer, ids, params)
    return GenerationStream(backend.generate(ids, params), builder).collect().token_ids


def test_backend_offers_an_executor_and_engine_uses_it(backend):
    assert backend.capabilities().executor is True
    with ServingEngine(backend, EngineOptions(max_num_seqs=2), owns_backend=False) as eng:
        assert eng.path == "executor"
        assert eng.info.context_length <= 256


def test_batched_engine_output_equals_request_level_generate(backend):
    params = GenerationParams(max_tokens=12)
    ids = [backend.tokenizer.encode(p) for p in PROMPTS]
    with ServingEngine(backend, EngineOptions(max_num_seqs=4), owns_backend=False) as eng:
        results = eng.generate_sync(ids, params)
        assert eng.metrics().kv_usage == 0.0
    for i, r in zip(ids, results, strict=True):
        assert r.token_ids == alone(backend, i, params)


def test_chunked_prefill_equals_one_shot_prefill(backend):
    params = GenerationParams(max_tokens=8)
    ids = backend.tokenizer.encode(LONG)
    assert len(ids) >= 30  # several 7-token chunks
    with ServingEngine(backend, EngineOptions(max_num_seqs=2, max_batch_tokens=7), owns_backend=False) as eng:
        chunked = eng.generate_sync([ids], params)[0]
    assert chunked.token_ids == alone(backend, ids, params)


def test_preemption_by_recompute_on_the_real_model(backend):
    params = GenerationParams(max_tokens=24, ignore_eos=True)
    ids = [backend.tokenizer.encode(p) for p in PROMPTS]
    # 6 blocks of 16 tokens cannot hold 4 requests of ~8 + 24 tokens at once.
    opts = EngineOptions(max_num_seqs=4, num_blocks=6, watermark=0.0, enable_prefix_caching=False)
    with ServingEngine(backend, opts, owns_backend=False) as eng:
        results = eng.generate_sync(ids, params)
        assert eng.metrics().preemptions > 0
        assert eng.metrics().kv_usage == 0.0
    for i, r in zip(ids, results, strict=True):
        assert r.token_ids == alone(backend, i, params)


def test_prefix_cache_copy_from_a_donor_sequence(backend):
    params = GenerationParams(max_tokens=8)
    system = backend.tokenizer.encode(LONG)
    ids = [[*system, *backend.tokenizer.encode(q, add_special=False)] for q in (" Why?", " How?")]
    with ServingEngine(backend, EngineOptions(max_num_seqs=2, prefix_donor_slots=1),
                       owns_backend=False) as eng:
        first = eng.generate_sync([ids[0]], params)[0]
        second = eng.generate_sync([ids[1]], params)[0]  # served from the first one's donor KV
        m = eng.metrics()
        assert m.prefix_cache_hits >= 16
    assert first.token_ids == alone(backend, ids[0], params)
    assert second.token_ids == alone(backend, ids[1], params)


def test_executor_rows_follow_entry_order_whatever_the_sequence_ids(backend):
    """The executor runs entries in ascending sequence id (one llama.cpp micro-batch) but must
    return logits rows in the caller's entry order."""
    import numpy as np
    from ruvllm.executor import BatchEntry

    ids = [backend.tokenizer.encode(p) for p in PROMPTS[:3]]
    seqs = (2, 0, 1)  # caller order differs from id order

    def run(order):
        ex = backend.create_executor(max_sequences=3, block_size=16)
        try:
            entries = [BatchEntry(seq_id=seqs[i], tokens=tuple(ids[i]), start_pos=0, block_table=[],
                                  sample=True) for i in order]
            logits = ex.execute(entries)
            return {seqs[i]: logits[row] for row, i in enumerate(order)}
        finally:
            ex.close()

    shuffled, in_order = run((0, 1, 2)), run((1, 2, 0))  # (2, 0, 1) vs (0, 1, 2)
    for s in seqs:
        assert int(np.argmax(shuffled[s])) == int(np.argmax(in_order[s]))
        np.testing.assert_allclose(shuffled[s], in_order[s], rtol=1e-4, atol=1e-4)
    # Different prompts give different rows: a mix-up of rows would be caught above.
    assert not np.allclose(shuffled[0], shuffled[1])


def test_slot_pool_hands_out_the_lowest_free_slot():
    from ruvllm.engine.slots import SlotPool

    pool = SlotPool(5)
    assert [pool.acquire() for _ in range(4)] == [0, 1, 2, 3]
    pool.release(2)
    pool.release(0)
    assert pool.acquire() == 0 and pool.acquire() == 2 and pool.acquire() == 4
    assert pool.acquire() is None


def test_executor_bridges_a_hole_in_sequence_ids_without_touching_the_absent_sequence(backend):
    """Sequences 0 and 2 decode while 1 (a donor, say) sits between them: the step is bridged
    with a throw-away token in 1, which must change neither 0's and 2's tokens nor 1's KV."""
    import numpy as np
    from ruvllm.executor import BatchEntry

    params = GenerationParams(max_tokens=6)
    ids = [backend.tokenizer.encode(p) for p in PROMPTS[:3]]
    ex = backend.create_executor(max_sequences=3, block_size=16)
    try:
        def entry(seq, tokens, start):
            return BatchEntry(seq_id=seq, tokens=tuple(tokens), start_pos=start, block_table=[], sample=True)

        first = ex.execute([entry(s, ids[s], 0) for s in range(3)])
        donor_len = ex.seq_len(1)
        donor_next = int(np.argmax(first[1]))
        out = {0: [int(np.argmax(first[0]))], 2: [int(np.argmax(first[2]))]}
        for _ in range(params.max_tokens - 1):
            logits = ex.execute([entry(s, [out[s][-1]], len(ids[s]) + len(out[s]) - 1) for s in (2, 0)])
            out[2].append(int(np.argmax(logits[0])))
            out[0].append(int(np.argmax(logits[1])))
            assert ex.seq_len(1) == donor_len  # the filler token was removed again
        # The donor's KV is intact: its next step gives what its prompt alone gives.
        again = ex.execute([entry(1, [donor_next], donor_len)])
        expected = alone(backend, ids[1], GenerationParams(max_tokens=2))
        assert [donor_next, int(np.argmax(again[0]))] == list(expected)
    finally:
        ex.close()
    assert out[0] == list(alone(backend, ids[0], params))
    assert out[2] == list(alone(backend, ids[2], params))
