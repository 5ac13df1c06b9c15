"""The batch executor: one forward per step equals single-sequence generation."""

from __future__ import annotations

import numpy as np
import pytest
import ruvllm.engine as engine_mod
from ruvllm import GenerationParams
from ruvllm.errors import BackendError, InvalidRequest
from ruvllm.executor import BatchEntry, BatchExecutor

STEPS = 5


def entry(seq_id, tokens, start, sample=True):
    return BatchEntry(seq_id=seq_id, tokens=tuple(tokens), start_pos=start, block_table=(), sample=sample)


def single_greedy(backend, ids, n):
    out = []
    for token in backend.generate(ids, GenerationParams(max_tokens=n)):
        out.append(token.token_id)
        if len(out) == n:
            break
    return out


@pytest.fixture()
def executor(backend):
    ex = backend.create_executor(max_sequences=8, block_size=16)
    yield ex
    ex.close()


def test_protocol_and_capacity(executor):
    assert isinstance(executor, BatchExecutor)
    assert executor.kv_layout == "per_sequence"
    assert executor.num_blocks >= 1 and executor.max_sequences == 8
    assert executor.max_seq_len == 2048


def test_batched_decode_equals_single_sequences(backend, executor, chat_ids):
    prompts = chat_ids[:4]
    expected = [single_greedy(backend, ids, STEPS) for ids in prompts]
    # Step 1: every prompt prefilled in one forward (a mixed batch of different lengths).
    logits = executor.execute([entry(i, ids, 0) for i, ids in enumerate(prompts)])
    assert logits.shape == (4, backend.info.vocab_size)
    produced = [[int(row.argmax())] for row in logits]
    positions = [len(ids) for ids in prompts]
    # Then every sequence decodes one token per step, all in one forward.
    for _ in range(STEPS - 1):
        logits = executor.execute([entry(i, [produced[i][-1]], positions[i]) for i in range(4)])
        for i in range(4):
            produced[i].append(int(logits[i].argmax()))
            positions[i] += 1
    assert produced == expected
    assert executor.held_tokens() == sum(positions)


def test_mixed_prefill_chunks_and_decode(backend, executor, chat_ids):
    a, b = chat_ids[4], chat_ids[5]
    want_a = single_greedy(backend, a, 3)
    want_b = single_greedy(backend, b, 2)
    half = len(b) // 2
    # a prefills whole while b's first chunk runs without sampling.
    logits = executor.execute([entry(0, a, 0), entry(1, b[:half], 0, sample=False)])
    assert logits.shape[0] == 1
    got_a = [int(logits[0].argmax())]
    # a decodes while b's final chunk prefills: both sampled.
    logits = executor.execute([entry(0, [got_a[-1]], len(a)), entry(1, b[half:], half)])
    got_a.append(int(logits[0].argmax()))
    got_b = [int(logits[1].argmax())]
    logits = executor.execute([entry(1, [got_b[-1]], len(b)), entry(0, [got_a[-1]], len(a) + 1)])
    got_b.append(int(logits[0].argmax()))
    got_a.append(int(logits[1].argmax()))
    assert got_a == want_a and got_b == want_b


def test_free_and_copy_prefix(backend, executor, chat_ids):
    ids = chat_ids[6]
    want = single_greedy(backend, ids, 2)
    executor.execute([entry(3, ids, 0)])
    # Share all but the last prompt token, then run that token on the copy.
    executor.copy_prefix(3, 4, len(ids) - 1)
    executor.free(3)
    logits = executor.execute([entry(4, ids[-1:], len(ids) - 1)])
    first = int(logits[0].argmax())
    logits = executor.execute([entry(4, [first], len(ids))])
    assert [first, int(logits[0].argmax())] == want
    executor.free(4)
    assert executor.held_tokens() == 0


def test_rewind_recomputes_from_position(backend, executor, chat_ids):
    ids = chat_ids[7]
    first = executor.execute([entry(0, ids, 0)])
    again = executor.execute([entry(0, ids[-3:], len(ids) - 3)])
    np.testing.assert_allclose(again[0], first[0], atol=1e-3)


def test_bad_steps_are_typed_errors(executor, chat_ids):
    with pytest.raises(InvalidRequest, match="twice"):
        executor.execute([entry(0, [1], 0), entry(0, [2], 1)])
    with pytest.raises(InvalidRequest, match="start_pos"):
        executor.execute([entry(1, [1, 2], 5)])
    with pytest.raises(InvalidRequest, match="vocabulary"):
        executor.execute([entry(2, [10**6], 0)])
    with pytest.raises(InvalidRequest, match="batch"):
        executor.execute([])
    with pytest.raises(BackendError, match="copy_prefix"):
        executor.copy_blocks([(0, 1)])
    with pytest.raises(InvalidRequest, match="src_seq_id"):
        executor.copy_prefix(42, 43, 1)


def test_max_sequences_is_enforced(backend):
    ex = backend.create_executor(max_sequences=2, block_size=16)
    ex.execute([entry(0, [1], 0), entry(1, [1], 0)])
    with pytest.raises(BackendError, match="max_sequences=2"):
        ex.execute([entry(2, [1], 0)])


def test_serving_engine_batches_requests(backend, chat_ids):
    prompts = chat_ids[:3]
    expected = [single_greedy(backend, ids, 4) for ids in prompts]
    params = GenerationParams(max_tokens=4, ignore_eos=True)
    options = engine_mod.EngineOptions(max_num_seqs=4)
    with engine_mod.ServingEngine(backend, options, owns_backend=False) as eng:
        assert eng.path == "executor"
        results = eng.generate_sync(prompts, params)
    assert [list(r.token_ids) for r in results] == expected
