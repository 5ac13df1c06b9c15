"""candle_like's ``embed_batch``: packed projections, padded masked attention, mean pooling."""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.testing.embeddings import (
    TOPIC_TEXTS,
    assert_same_direction,
    assert_separates_topics,
    assert_unit_rows,
)
from ruvllm_candle_like.embeddings import mean_pooled, token_batches

from .conftest import llama_cpp_or_skip

TEXTS = list(TOPIC_TEXTS)
#: float32 on the CPU: an input alone and inside a padded batch differ only in rounding (SDPA
#: over another padded length; oneDNN's blocking for another row count on dense weights). The
#: unnormalised pooled sums reach |15|, where an ulp is 1e-6: measured 1.3e-5 (14 ulps) at most
#: on the block kernel, so 1e-5 absolute plus 2e-6 relative. A leak (padding or a neighbour
#: attended to) moves a vector by orders of magnitude more.
FP32_TOLERANCE = {"atol": 1e-5, "rtol": 2e-6}


def ids_of(backend, texts):
    return [backend.tokenizer.encode(t) for t in texts]


def test_unit_vectors_that_separate_topics(backend_fp32):
    assert backend_fp32.capabilities().embeddings
    v = backend_fp32.embed_batch(ids_of(backend_fp32, TEXTS))
    assert_unit_rows(v, dim=576)
    assert_separates_topics(v)


def test_padding_and_neighbours_do_not_leak(backend_fp32):
    """Inputs of very different lengths in one padded batch: each vector is its solo vector, so
    the mask hides both the padding and the other inputs."""
    ids = ids_of(backend_fp32, [TEXTS[0], "word", TEXTS[2] * 5, TEXTS[3]])
    batch = backend_fp32.embed_batch(ids)
    alone = np.stack([backend_fp32.embed_batch([x])[0] for x in ids])
    np.testing.assert_allclose(batch, alone, **FP32_TOLERANCE)


def test_runs_split_by_the_token_budget_give_the_same_vectors(backend_fp32):
    ids = ids_of(backend_fp32, TEXTS)
    whole = mean_pooled(backend_fp32.model, ids, max_batch_tokens=4096)
    split = mean_pooled(backend_fp32.model, ids, max_batch_tokens=12)  # one input per run
    np.testing.assert_allclose(split, whole, **FP32_TOLERANCE)
    # SONA's unnormalised embed() is the same pooling.
    np.testing.assert_allclose(backend_fp32.embed(ids[1]), whole[1], **FP32_TOLERANCE)


def test_token_batches():
    assert list(token_batches([[1] * 3, [1] * 5, [1] * 2], 10)) == [(0, 2), (2, 3)]
    assert list(token_batches([[1] * 20, [1]], 10)) == [(0, 1), (1, 2)]
    assert list(token_batches([[1]] * 4, 2)) == [(0, 2), (2, 4)]


def test_bad_inputs_are_refused_by_name(backend_fp32):
    limit = backend_fp32.max_embedding_tokens()
    with pytest.raises(InvalidRequest, match=f"at most {limit} tokens") as exc:
        backend_fp32.embed_batch([[1], [5] * (limit + 1)])
    assert exc.value.field == "input[1]"
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        backend_fp32.embed_batch([[-1]])


def test_matches_llama_cpp_mean_pooling(backend_fp32, embedded_source):
    """The same pooling as llama.cpp's embeddings mode on the same GGUF: candle_like computes
    with dequantized weights, llama.cpp with quantized activations, hence cosine, not equality
    (measured: >= 0.9988)."""
    llama_cpp = llama_cpp_or_skip()
    ll = llama_cpp.Llama(str(embedded_source.path), embedding=True, n_ctx=256, n_threads=1, verbose=False,
                         pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    try:
        ref = np.array(ll.embed(TEXTS, normalize=True), dtype=np.float32)
    finally:
        ll.close()
    ours = backend_fp32.embed_batch(ids_of(backend_fp32, TEXTS))
    assert_same_direction(ours, ref, min_cosine=0.995)
