"""The ServingEngine on the real llama.cpp executor and the embedded model.

The executor's KV is one unified pool: a sequence's logits depend slightly on where its cells
sit and what else occupies the pool (attention sums group values by cell), so the engine's
tokens are compared with the request-level context's under the isolation rule
(:mod:`ruvllm.testing.isolation`): the request-level context is teacher-forced on the engine's
tokens, and the engine may pick another token only at a near-tie of that solo row.
"""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm.config import default_cache_dir
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import BackendError, InvalidRequest
from ruvllm.executor import BatchEntry
from ruvllm.registry import resolve
from ruvllm.testing.isolation import LogitsRecorder, NearTieRule
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


def solo_rows(backend, prompt, tokens) -> list[np.ndarray]:
    """The request-level context's logits before each of ``tokens``, teacher-forced on them."""
    kv = backend.sequence
    kv.clear()
    try:
        rows = [np.array(kv.decode(prompt))]
        rows += [np.array(kv.decode([t])) for t in tokens[:-1]]
    finally:
        kv.clear()
    return rows


def run_recorded(eng, prompts, params):
    """Submit every prompt at once, each with a recorder of the rows the engine sampled from."""
    recorders = [LogitsRecorder() for _ in prompts]
    handles = [eng.submit_sync(p, params, logits_processors=[r])
               for p, r in zip(prompts, recorders, strict=True)]
    return [h.result() for h in handles], recorders


def assert_solo_within_near_ties(backend, prompts, results, recorders):
    rule = NearTieRule()
    problems = []
    for prompt, result, recorder in zip(prompts, results, recorders, strict=True):
        assert result.token_ids, result
        reference = solo_rows(backend, prompt, result.token_ids)
        for k, (ref, got) in enumerate(zip(reference, recorder.rows, strict=True)):
            d = rule.compare_row(k, ref, got)
            if d is not None and not d.allowed:
                problems.append(d.describe(backend.tokenizer.token_text))
    assert not problems, "\n".join(problems)


def test_backend_offers_an_executor_and_engine_uses_it(backend):
    assert backend.capabilities().executor is True
    with ServingEngine(backend, EngineOptions(max_num_seqs=2), owns_backend=False) as eng:
        assert eng.path == "executor"
        assert eng.info.context_length <= 256


def test_batched_engine_output_equals_request_level_generate(backend):
    params = GenerationParams(max_tokens=12)
    ids = [backend.tokenizer.encode(p) for p in PROMPTS]
    with ServingEngine(backend, EngineOptions(max_num_seqs=4), owns_backend=False) as eng:
        results, recorders = run_recorded(eng, ids, params)
        assert eng.metrics().kv_usage == 0.0
    assert_solo_within_near_ties(backend, ids, results, recorders)


def test_chunked_prefill_equals_one_shot_prefill(backend):
    params = GenerationParams(max_tokens=8)
    ids = backend.tokenizer.encode(LONG)
    assert len(ids) >= 30  # several 7-token chunks
    with ServingEngine(backend, EngineOptions(max_num_seqs=2, max_batch_tokens=7), owns_backend=False) as eng:
        results, recorders = run_recorded(eng, [ids], params)
    assert_solo_within_near_ties(backend, [ids], results, recorders)


def test_preemption_by_recompute_on_the_real_model(backend):
    params = GenerationParams(max_tokens=24, ignore_eos=True)
    ids = [backend.tokenizer.encode(p) for p in PROMPTS]
    # 6 blocks of 16 tokens cannot hold 4 requests of ~8 + 24 tokens at once.
    opts = EngineOptions(max_num_seqs=4, num_blocks=6, watermark=0.0, enable_prefix_caching=False)
    with ServingEngine(backend, opts, owns_backend=False) as eng:
        results, recorders = run_recorded(eng, ids, params)
        assert eng.metrics().preemptions > 0
        assert eng.metrics().kv_usage == 0.0
    assert_solo_within_near_ties(backend, ids, results, recorders)


def test_preempted_requests_come_back_from_their_parked_kv(backend):
    """The same kind of demand with the prefix cache on, as served: a preempted request's KV is
    parked whole and, when it runs again, restored rather than recomputed (the engine's prefix
    hits hold at least a whole prompt, where the four prompts differ from their first token),
    found by its tokens where the pool gave its blocks to the others; every output stays within
    near-ties of its request alone. Its usage reports what its first admission found, as vLLM
    does: finding its own KV again saved the user no prompt work."""
    params = GenerationParams(max_tokens=24, ignore_eos=True)
    ids = [backend.tokenizer.encode(f"{p} {LONG}") for p in PROMPTS]
    assert len({p[0] for p in ids}) == len(ids)
    # 10 blocks of 16 tokens cannot hold 4 requests of ~45 + 24 tokens at once.
    opts = EngineOptions(max_num_seqs=4, num_blocks=10, watermark=0.0)
    with ServingEngine(backend, opts, owns_backend=False) as eng:
        results, recorders = run_recorded(eng, ids, params)
        metrics = eng.metrics()
        assert metrics.preemptions > 0
        assert metrics.kv_usage == 0.0
        assert metrics.prefix_cache_hits >= min(len(p) for p in ids)
    assert [r.usage.cached_prompt_tokens for r in results] == [0] * len(ids)
    assert_solo_within_near_ties(backend, ids, results, recorders)


def test_prefix_cache_copy_from_a_donor_sequence(backend):
    params = GenerationParams(max_tokens=8)
    system = backend.tokenizer.encode(LONG)
    ids = [[*system, *backend.tokenizer.encode(q, add_special=False)] for q in (" Why?", " How?")]
    with ServingEngine(backend, EngineOptions(max_num_seqs=2, prefix_donor_slots=1),
                       owns_backend=False) as eng:
        first, first_rows = run_recorded(eng, [ids[0]], params)
        second, second_rows = run_recorded(eng, [ids[1]], params)  # from the first one's donor KV
        m = eng.metrics()
        assert m.prefix_cache_hits >= 16
    assert_solo_within_near_ties(backend, ids, first + second, first_rows + second_rows)


def test_by_default_32_clients_taking_turns_find_their_prompts_again(backend):
    """Resent prompts are found whole, as llama-server's prompt cache finds them: with the
    default donors (``auto``: 64 on llamacpp) all 32, twice the 16 that run at once, each to its
    last token (33 of 34: two full blocks and the partial third the parked donor keeps); with
    16, the default until 2026-12-02, none (each prefix is replaced before it comes back), and
    with 2, as before 2026-11-28, none of 8."""
    prompts = [backend.tokenizer.encode(f"List {i}: " + ", ".join(str(97 * i + j) for j in range(20)))[:34]
               for i in range(32)]
    params = GenerationParams(max_tokens=1)
    with ServingEngine(backend, EngineOptions(max_num_seqs=16), owns_backend=False) as eng:
        eng.generate_sync(prompts, params)
        kept = eng.metrics()
        # What they cost is on /metrics: 32 kept prompts, each 32 tokens' KV in host memory.
        assert kept.prefix_cache_prompts == 32
        assert kept.prefix_cache_host_bytes >= 32 * 32 * backend.kv_bytes_per_token
        eng.generate_sync(prompts, params)
        assert eng.metrics().prefix_cache_hits - kept.prefix_cache_hits == 32 * 33


def test_auto_donors_fit_beside_a_large_max_num_seqs(backend):
    """llama.cpp holds 256 sequence ids: with 250 running, ``auto`` keeps 6 prompts instead of
    64 rather than failing at start-up; a number that does not fit is refused by name."""
    with ServingEngine(backend, EngineOptions(max_num_seqs=250), owns_backend=False) as eng:
        prompt = backend.tokenizer.encode("Hi")
        assert eng.generate_sync([prompt], GenerationParams(max_tokens=1))[0].token_ids
    with pytest.raises(InvalidRequest, match="prefix_donor_slots"):
        ServingEngine(backend, EngineOptions(max_num_seqs=250, prefix_donor_slots=16), owns_backend=False)


@pytest.mark.parametrize("question", [LONG * 2 + " Why did they measure it?", LONG + " Why?"],
                         ids=["over-64-tokens", "under-64-tokens"])
def test_a_request_repeated_after_other_traffic_computes_the_same_logits(backend, question):
    """The same greedy request twice on an idle engine, other requests (and a hit on its own
    cached prefix) between: every row it samples from is bit-identical. The hit brings every
    prompt position but the last back as the bytes the first run computed (donors are parked,
    so the idle pool holds nothing else, and a hit ends on a token), and the first run prefilled
    the rows after the last whole block by themselves (``split_prompt_tail``: flash attention's
    tiled and per-row kernels round differently), as the repeat computes its last one.
    Without that split this test fails at the first row; with flash attention off and donors
    kept in the pool (``park_prefixes = false``) it failed too (rows moved by 0.58). A prompt
    under 64 tokens, alone in its step, is prefilled in one step (``split_prompt_tail_rows``):
    every row of it takes the per-row kernel already."""
    question = backend.tokenizer.encode(question)
    params = GenerationParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    others = [backend.tokenizer.encode(p) for p in (*PROMPTS[:2], LONG * 2)]
    with ServingEngine(backend, EngineOptions(max_num_seqs=4), owns_backend=False) as eng:
        first, first_rows = run_recorded(eng, [question], params)
        run_recorded(eng, others, GenerationParams(max_tokens=21, ignore_eos=True))
        run_recorded(eng, [backend.tokenizer.encode(p) for p in PROMPTS[2:]], GenerationParams(max_tokens=7))
        again, again_rows = run_recorded(eng, [question], params)
        assert again[0].usage.cached_prompt_tokens == len(question) - 1
    assert again[0].token_ids == first[0].token_ids
    for a, b in zip(first_rows[0].rows, again_rows[0].rows, strict=True):
        np.testing.assert_array_equal(a, b)


def test_executor_rows_follow_entry_order_whatever_the_sequence_ids(backend):
    """The executor returns logits rows in the caller's entry order, whatever the ids."""
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
        np.testing.assert_allclose(shuffled[s], in_order[s], rtol=1e-3, atol=1e-3)
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


def test_a_copied_prefix_shares_cells_and_a_trim_frees_them():
    """One pool of 256 cells: a 200-token prefix copied to two more sequences takes no cell
    (three private copies would need 600), and trimming and freeing them gives the cells back
    to a new 230-token prompt. llama.cpp refuses a step it has no cells for, so each step
    passing is the proof."""
    b = ruvllm_llamacpp.LlamaCppBackend.load(resolve("default", default_cache_dir()),
                                             {"n_ctx": 256, "n_threads": 1, "kv_budget_mib": 1})
    try:
        ex = b.create_executor(max_sequences=4, block_size=16)
        assert ex.pool.tokens == 256
        tokens = (b.tokenizer.encode(LONG) * 12)[:230]
        prefix = tokens[:200]
        ex.execute([BatchEntry(seq_id=0, tokens=tuple(prefix), start_pos=0, block_table=[], sample=True)])
        for dst in (1, 2):
            ex.copy_prefix(0, dst, 192)
        step = [BatchEntry(seq_id=s, tokens=(prefix[192 + s],), start_pos=192, block_table=[],
                           sample=True) for s in (1, 2)]
        ex.execute(step)  # 200 + 2 cells in use: the copies share the first 192
        assert ex.seq_len(1) == ex.seq_len(2) == 193
        ex.trim(0, 16)
        for s in (1, 2):
            ex.free(s)
        ex.execute([BatchEntry(seq_id=3, tokens=tuple(tokens), start_pos=0, block_table=[],
                               sample=True)])
        assert ex.seq_len(0) == 16 and ex.seq_len(3) == 230
        ex.close()
    finally:
        b.close()


def test_a_parked_donor_frees_its_cells_and_comes_back_as_the_same_kv():
    """A donor leaves the pool for host memory: in a pool of 256 cells a 230-token prompt fits
    beside a 192-token donor (both in the pool would need 422), and a restored part of the donor
    gives the logits a fresh prefill gives, bit for bit (its bytes are the ones the prefill
    computed, cut at position 160). Flash attention off: with it a 162-row prefill takes another
    kernel than the restored prefix's 2-row step (the repeat test covers parking with it)."""
    b = ruvllm_llamacpp.LlamaCppBackend.load(resolve("default", default_cache_dir()),
                                             {"n_ctx": 256, "n_threads": 1, "kv_budget_mib": 1,
                                              "flash_attn": "off"})
    try:
        ex = b.create_executor(max_sequences=4, block_size=16)
        assert ex.pool.tokens == 256 and ex.detached_donors
        tokens = (b.tokenizer.encode(LONG) * 12)[:230]

        def run(seq, start, end):
            return ex.execute([BatchEntry(seq_id=seq, tokens=tuple(tokens[start:end]), start_pos=start,
                                          block_table=[], sample=True)])[0]

        run(0, 0, 200)
        assert ex.parked_bytes == 0
        ex.retire(0, 192)
        assert ex.seq_len(0) == 192
        per_token = b.kv_bytes_per_token
        assert 192 * per_token <= ex.parked_bytes < 193 * per_token  # the KV and a small header
        run(1, 0, 230)  # llama.cpp refuses a step it has no cells for
        ex.free(1)
        ex.copy_prefix(0, 2, 160)
        assert ex.seq_len(2) == 160
        restored = run(2, 160, 162)
        ex.free(2)
        np.testing.assert_array_equal(restored, run(3, 0, 162))
        ex.retire(0, 64)  # a parked donor cut shorter (the engine reused its later blocks)
        assert ex.seq_len(0) == 64
        with pytest.raises(BackendError, match="keeps 64 positions; 80 were asked for"):
            ex.copy_prefix(0, 2, 80)
        ex.copy_prefix(0, 2, 64)
        assert ex.seq_len(2) == 64
        assert 64 * per_token <= ex.parked_bytes < 65 * per_token  # the metric follows the cut
        ex.free(0)
        assert ex.parked_bytes == 0
        ex.close()
    finally:
        b.close()


def test_a_pool_smaller_than_the_batch_caps_the_step():
    """llama.cpp caps a context's batch at its cell count and aborts the whole process on a
    larger step; the executor says the capped size, so the engine plans within it and a caller
    that asks more gets an error, not a dead server."""
    b = ruvllm_llamacpp.LlamaCppBackend.load(resolve("default", default_cache_dir()),
                                             {"n_ctx": 1024, "n_threads": 1, "kv_budget_mib": 1})
    try:
        assert b.n_batch > 256
        ex = b.create_executor(max_sequences=2, block_size=16)
        assert ex.pool.tokens == 256 and ex.max_batch_tokens == 256
        tokens = tuple((b.tokenizer.encode(LONG) * 12)[:300])
        with pytest.raises(BackendError, match="a step holds 300 tokens"):
            ex.execute([BatchEntry(seq_id=0, tokens=tokens, start_pos=0, block_table=[], sample=True)])
        ex.close()
    finally:
        b.close()
