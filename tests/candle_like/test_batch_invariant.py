"""candle_like's batch-invariant executor: a sequence's logits rows are the same bits alone, in
batches of 2 and 5, and with its prompt prefilled in chunks beside others; the default executor's
on dense weights are not (so the comparison can fail), and the mode is refused where it cannot
hold. On GGUF blocks with ruvllm's native kernels the default executor already gives a row the same
bits in any batch (not in any chunking: that still takes the mode)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import BatchInvariantUnsupported, InvalidRequest
from ruvllm.executor import BatchEntry
from ruvllm.models import ModelSource
from ruvllm.testing.speculative import COPY_PROMPT, tokens_and_logprobs, with_and_without
from ruvllm.types import GenerationParams
from ruvllm_candle_like import blockmm, invariant
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.executor import PagedExecutor, on_native_kernel

from .test_lora import random_adapter

PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time", "Dear Sir or Madam,",
           "The quick brown fox")
BLOCK = 16
BLOCKS_PER_SEQ = 4
DECODE_STEPS = 3


def _executor(backend: CandleLikeBackend, batch_invariant: bool) -> PagedExecutor:
    return PagedExecutor(backend.model, max_sequences=8, block_size=BLOCK,
                         num_tokens=8 * BLOCKS_PER_SEQ * BLOCK, max_batch_tokens=512,
                         kv_dtype=backend.kv_dtype, batch_invariant=batch_invariant)


def _rows_of_first(ex: PagedExecutor, prompts: Sequence[list[int]],
                   chunk: int | None = None) -> list[np.ndarray]:
    """Greedy-run ``prompts`` together (prefill in ``chunk``-token pieces when given, then
    DECODE_STEPS decode steps); the logits rows of the first prompt, step by step."""
    tables = [tuple(range(i * BLOCKS_PER_SEQ, (i + 1) * BLOCKS_PER_SEQ)) for i in range(len(prompts))]
    seqs = [list(p) for p in prompts]
    done = [0] * len(prompts)
    rows: list[np.ndarray] = []

    def run(entries: list[BatchEntry]) -> None:
        out = ex.execute(entries)
        for row, e in zip(out, [e for e in entries if e.sample], strict=True):
            if e.seq_id == 0:
                rows.append(row.copy())
            seqs[e.seq_id].append(int(row.argmax()))

    while any(d < len(p) for d, p in zip(done, prompts, strict=True)):
        entries = []
        for i, p in enumerate(prompts):
            if done[i] < len(p):
                n = len(p) - done[i] if chunk is None else min(chunk, len(p) - done[i])
                entries.append(BatchEntry(seq_id=i, tokens=tuple(p[done[i]:done[i] + n]), start_pos=done[i],
                                          block_table=tables[i], sample=done[i] + n == len(p)))
                done[i] += n
        run(entries)
    for _ in range(DECODE_STEPS):
        run([BatchEntry(seq_id=i, tokens=(s[-1],), start_pos=len(s) - 1, block_table=tables[i])
             for i, s in enumerate(seqs)])
    return rows


def _identical(a: list[np.ndarray], b: list[np.ndarray]) -> list[bool]:
    return [bool(np.array_equal(x, y)) for x, y in zip(a, b, strict=True)]


@pytest.fixture(scope="module")
def prompts(backend_fp32) -> list[list[int]]:
    return [backend_fp32.tokenizer.encode(p) for p in PROMPTS]


def test_rows_are_the_same_bits_whatever_the_batch(backend_fp32, prompts) -> None:
    ex = _executor(backend_fp32, batch_invariant=True)
    alone = _rows_of_first(ex, prompts[:1])
    for batch in (prompts[:2], prompts):
        assert all(_identical(alone, _rows_of_first(ex, batch))), f"batch of {len(batch)}"
    assert all(_identical(alone, _rows_of_first(ex, prompts, chunk=3))), "prefilled in chunks of 3"
    # The prompt recomputed as one chunk with its decoded tokens (preemption's recompute).
    tokens = [*prompts[0], *(int(r.argmax()) for r in alone[:-1])]
    recomputed = ex.execute([BatchEntry(seq_id=0, tokens=tuple(tokens), start_pos=0,
                                        block_table=tuple(range(BLOCKS_PER_SEQ)), all_logits=True)])
    assert all(_identical(alone, list(recomputed[len(prompts[0]) - 1:])))


@pytest.fixture(scope="module")
def backend_dense(embedded_source):
    """Dense float32 weights on oneDNN, whose lone-row GEMV gives other bits than a batch's rows."""
    b = CandleLikeBackend.load(embedded_source, {"dtype": "float32", "int4_weights": False})
    yield b
    b.close()


def test_the_default_executor_is_not_batch_invariant(backend_dense, prompts) -> None:
    """What the mode fixes: the same comparison on the default path finds other bits."""
    ex = _executor(backend_dense, batch_invariant=False)
    assert not all(_identical(_rows_of_first(ex, prompts[:1]), _rows_of_first(ex, prompts)))


@pytest.mark.skipif(blockmm.unavailable() is not None, reason=str(blockmm.unavailable()))
def test_native_kernels_give_a_row_the_same_bits_in_any_batch_by_default(backend_fp32, prompts) -> None:
    """The block kernel (one FMA chain per output) and the native attention (each row over its
    own prefix) make the default executor batch-invariant: alone, beside 1 and 4 others, and
    prefilled in chunks of 3, a prompt of more than 24 tokens too (the bound was 16 before). The
    mode is still what holds for prompts of over 1,024 tokens, whose later chunks attend through
    SDPA's tiled kernel (executor.on_native_kernel)."""
    ex = _executor(backend_fp32, batch_invariant=False)
    assert ex.native_decode_off is None
    assert all(on_native_kernel(0, len(p)) for p in prompts)
    alone = _rows_of_first(ex, prompts[:1])
    for batch in (prompts[:2], prompts):
        assert all(_identical(alone, _rows_of_first(ex, batch))), f"batch of {len(batch)}"
    assert all(_identical(alone, _rows_of_first(ex, prompts, chunk=3))), "prefilled in chunks of 3"
    longer = [*prompts[0], *backend_fp32.tokenizer.encode(" " + " ".join(PROMPTS[1:]))][:40]
    assert len(longer) > 24 and on_native_kernel(0, len(longer))
    batch = [longer, *prompts[1:]]
    assert all(_identical(_rows_of_first(ex, batch), _rows_of_first(ex, batch, chunk=3))), "a longer prompt"


def test_which_chunks_attend_on_the_native_kernel() -> None:
    """Up to 24 rows anywhere (decode, a speculative verification, a short new turn); every
    chunk of a prompt of up to 1,024 tokens, in any chunking; not a longer chunk past that, such
    as a long new turn after a long cached conversation, where SDPA's tiles win (1.07-1.33x)."""
    assert all(on_native_kernel(start, rows) for start in (0, 100, 8000) for rows in (1, 16, 24))
    prompt_chunks = [(start, rows) for start in range(0, 1024, 31) for rows in range(1, 1025 - start, 17)]
    assert all(on_native_kernel(start, rows) for start, rows in prompt_chunks)
    assert not on_native_kernel(0, 1025) and not on_native_kernel(2048, 25) and not on_native_kernel(1000, 25)


def test_the_kernel_check_passes_here_and_catches_an_unpadded_row(backend_dense, monkeypatch) -> None:
    assert invariant.check_kernels(backend_dense.model) is None
    monkeypatch.setattr(invariant, "ROW_BLOCK", 1)  # lone rows meet the GEMV kernel again
    assert "projection computes a row with other bits" in str(invariant.check_kernels(backend_dense.model))


def test_two_tier_cache_refuses_the_mode(embedded_source: ModelSource) -> None:
    backend = CandleLikeBackend.load(embedded_source, {"dtype": "float32", "kv_cache": "two_tier",
                                                       "prepack_weights": False})
    try:
        with pytest.raises(BatchInvariantUnsupported, match="two_tier"):
            ServingEngine(backend, EngineOptions(batch_invariant=True, max_num_seqs=2), owns_backend=False)
    finally:
        backend.close()


def test_engine_serves_the_mode_and_says_so(backend_fp32) -> None:
    options = EngineOptions(batch_invariant=True, max_num_seqs=4)
    engine = ServingEngine(backend_fp32, options, owns_backend=False)
    try:
        assert engine.capabilities.batch_invariant
        assert engine._core.executor.batch_invariant
        # A few tokens: a solo decode step on the mode's padded kernels costs 1.7x a default one.
        assert engine.generate_sync(["Hello"], GenerationParams(max_tokens=8))[0].token_ids
    finally:
        engine.close()


def _answers(engine: ServingEngine, flagged: bool, beside: int) -> tuple:
    """The first prompt's answer (tokens and logprobs), run with ``beside`` other prompts at once
    that do not ask for the guarantee."""
    ask = GenerationParams(max_tokens=8, temperature=0.0, logprobs=2, batch_invariant=flagged)
    other = GenerationParams(max_tokens=12, temperature=0.0)
    handles = [engine.submit_sync(engine.encode(PROMPTS[0]), ask)]
    handles += [engine.submit_sync(engine.encode(p * 3), other) for p in PROMPTS[1:1 + beside]]
    first = handles[0].result()
    for h in handles[1:]:
        h.result()
    return first.token_ids, first.logprobs


def test_a_request_may_ask_for_it_on_an_engine_without_the_mode(backend_dense) -> None:
    """Its rows take the mode's kernels in a pass of their own; the rows beside it keep the
    default ones, and an unflagged request run the same way moves (so the comparison can fail:
    on dense weights, whose default kernels move with the batch)."""
    engine = ServingEngine(backend_dense, EngineOptions(max_num_seqs=8), owns_backend=False)
    try:
        assert not engine.capabilities.batch_invariant and engine._core.executor.invariant_rows
        assert _answers(engine, True, 0) == _answers(engine, True, 4)
        assert _answers(engine, False, 0) != _answers(engine, False, 4)
        backend_dense.publish_adapter(random_adapter(backend_dense, "t-inv", seed=5))
        try:
            with pytest.raises(InvalidRequest, match=r"batch_invariant.*LoRA"):
                engine.submit_sync([1, 2, 3], GenerationParams(batch_invariant=True, adapter="t-inv"))
        finally:
            backend_dense.unload_adapter("t-inv")
    finally:
        engine.close()


def test_speculative_drafts_change_no_bit_in_the_mode(backend_fp32, backend_dense) -> None:
    """Drafted positions are verified as one chunk of rows; in the mode a chunk's rows are the
    bits of one-by-one decoding, so tokens and logprobs equal plain decoding's exactly. In the
    default mode on dense weights the same comparison fails on logprobs (the chunk takes other
    kernels); on the native kernels a short chunk's rows are decoding's bits by default too."""
    params = GenerationParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=2)
    prompts = [COPY_PROMPT, PROMPTS[1]]
    plain, drafted, snap = with_and_without(backend_fp32, prompts, params, options={"batch_invariant": True})
    assert snap.spec_decode_accepted_tokens > 6, snap
    assert tokens_and_logprobs(drafted) == tokens_and_logprobs(plain)
    plain, drafted, _ = with_and_without(backend_dense, prompts, params)
    assert tokens_and_logprobs(drafted) != tokens_and_logprobs(plain)
    if blockmm.unavailable() is None:
        plain, drafted, _ = with_and_without(backend_fp32, prompts, params)
        assert tokens_and_logprobs(drafted) == tokens_and_logprobs(plain)
