"""The paged executor: one batched forward per step gives the same logits as running each
sequence alone, with prefill chunks and decode tokens mixed in one step."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ruvllm.errors import InvalidRequest
from ruvllm.executor import BatchEntry, BatchExecutor

BLOCK = 4
#: float32 compute: a matmul over more rows is blocked differently by oneDNN, so logits of the
#: same token differ in the last bits between batch shapes (measured ~3e-3); tokens agree.
ATOL = 2e-2


@pytest.fixture(scope="module")
def executor(backend_fp32):
    return backend_fp32.create_executor(max_sequences=8, block_size=BLOCK)


def _single(backend, ids):
    """Logits after every prefix length, from the request-level contiguous cache."""
    cache = backend.new_cache(len(ids))
    return [backend.step(cache, [t]).numpy() for t in ids]


def _table(first_block, n_tokens):
    return tuple(range(first_block, first_block + -(-n_tokens // BLOCK)))


def test_is_a_batch_executor(executor, backend_fp32):
    assert isinstance(executor, BatchExecutor)
    assert executor.kv_layout == "paged"
    assert backend_fp32.capabilities().executor


def test_batched_steps_equal_single_sequence(backend_fp32, executor):
    tok = backend_fp32.tokenizer
    prompts = [tok.encode(p) for p in ("The capital of France is", "def add(a, b):", "Hi there, friend")]
    extra = [[260, 314, 282], [29, 30, 31], [198, 7042, 11]]
    seqs = [p + e for p, e in zip(prompts, extra, strict=True)]
    expected = [_single(backend_fp32, s) for s in seqs]
    total = max(len(s) for s in seqs)
    tables = [_table(i * 16, total) for i in range(3)]
    # Step 1: seq 0 and 1 prefill in full; seq 2 prefills only its first token (chunked).
    out = executor.execute([
        BatchEntry(seq_id=0, tokens=tuple(prompts[0]), start_pos=0, block_table=tables[0]),
        BatchEntry(seq_id=1, tokens=tuple(prompts[1]), start_pos=0, block_table=tables[1]),
        BatchEntry(seq_id=2, tokens=tuple(prompts[2][:1]), start_pos=0, block_table=tables[2], sample=False),
    ])
    assert out.shape == (2, backend_fp32.info.vocab_size)
    np.testing.assert_allclose(out[0], expected[0][len(prompts[0]) - 1], atol=ATOL)
    np.testing.assert_allclose(out[1], expected[1][len(prompts[1]) - 1], atol=ATOL)
    pos = [len(prompts[0]), len(prompts[1]), 1]
    # Later steps: decode tokens for 0 and 1 mixed with the rest of seq 2's prompt, then decodes.
    for step in range(3):
        batch = [BatchEntry(seq_id=i, tokens=(seqs[i][pos[i]],), start_pos=pos[i], block_table=tables[i])
                 for i in (0, 1)]
        rest = seqs[2][pos[2]: len(prompts[2])] if step == 0 else (seqs[2][pos[2]],)
        batch.append(BatchEntry(seq_id=2, tokens=tuple(rest), start_pos=pos[2], block_table=tables[2]))
        out = executor.execute(batch)
        for row, e in enumerate(batch):
            last = e.start_pos + len(e.tokens) - 1
            np.testing.assert_allclose(out[row], expected[e.seq_id][last], atol=ATOL)
            assert int(out[row].argmax()) == int(expected[e.seq_id][last].argmax())
            pos[e.seq_id] = last + 1
    for i in range(3):
        executor.free(i)


def test_decode_batch_with_different_lengths(backend_fp32, executor):
    seqs = [[29, 30, 31, 32, 33, 34, 35], [400, 401], [7042, 11, 198, 314]]
    expected = [_single(backend_fp32, s) for s in seqs]
    tables = [_table(60 + i * 8, 8) for i in range(3)]
    executor.execute([BatchEntry(seq_id=i, tokens=tuple(s[:-1]), start_pos=0, block_table=tables[i])
                      for i, s in enumerate(seqs)])
    out = executor.execute([BatchEntry(seq_id=i, tokens=(s[-1],), start_pos=len(s) - 1, block_table=tables[i])
                            for i, s in enumerate(seqs)])
    for i in range(len(seqs)):
        np.testing.assert_allclose(out[i], expected[i][-1], atol=ATOL)


def test_copy_blocks_copies_kv(executor):
    with torch.inference_mode():
        executor.k[0][0:BLOCK] = 1.0
        executor.copy_blocks([(0, 5)])
        assert torch.equal(executor.k[0][5 * BLOCK: 6 * BLOCK], executor.k[0][0:BLOCK])


def test_bad_batches_are_rejected(executor):
    with pytest.raises(InvalidRequest, match="block_table"):
        executor.execute([BatchEntry(seq_id=0, tokens=(1, 2, 3, 4, 5), start_pos=0, block_table=(0,))])
    with pytest.raises(InvalidRequest, match="tokens"):
        executor.execute([BatchEntry(seq_id=0, tokens=(10**7,), start_pos=0, block_table=(0,))])
