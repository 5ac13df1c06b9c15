"""llama.cpp's embeddings mode behind ``LlmBackend.embed_batch`` (MEAN pooling, own context)."""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.models import ModelSource
from ruvllm.testing.embeddings import (
    TOPIC_TEXTS,
    assert_same_direction,
    assert_separates_topics,
    assert_unit_rows,
)
from ruvllm.types import GenerationParams
from ruvllm_llamacpp.backend import LlamaCppBackend
from ruvllm_llamacpp.embeddings import packed_runs

TEXTS = list(TOPIC_TEXTS)


@pytest.fixture(scope="module")
def backend(model_path, test_options):
    b = LlamaCppBackend.load(ModelSource.from_path(model_path), {**test_options, "embedding_tokens": 64})
    yield b
    b.close()


def ids_of(backend, texts):
    return [backend.tokenizer.encode(t) for t in texts]


def test_context_is_created_on_first_use_and_kept(backend):
    assert backend.capabilities().embeddings
    assert backend._handles.embedder is None  # loading does not pay for it (serve's idle memory)
    backend.embed_batch(ids_of(backend, TEXTS[:1]))
    first = backend._handles.embedder
    assert first is not None and first.n_tokens == backend.max_embedding_tokens() == 64
    backend.embed_batch(ids_of(backend, TEXTS[1:2]))
    assert backend._handles.embedder is first


def test_unit_vectors_that_separate_topics(backend):
    v = backend.embed_batch(ids_of(backend, TEXTS))
    assert_unit_rows(v, dim=576)  # SmolLM2-135M's hidden size
    assert_separates_topics(v)


def test_batched_equals_alone_also_across_several_decodes(backend):
    """64 tokens of context: the 12 inputs below need several llama_decode calls."""
    ids = ids_of(backend, TEXTS * 3)
    assert sum(map(len, ids)) > backend.max_embedding_tokens()
    batch = backend.embed_batch(ids)
    alone = np.stack([backend.embed_batch([x])[0] for x in ids[:4]])
    assert_same_direction(batch[:4], alone)
    assert_same_direction(batch[4:8], alone)


def test_bad_inputs_are_refused_by_name(backend):
    with pytest.raises(InvalidRequest, match="at most 64 tokens") as exc:
        backend.embed_batch([[1, 2], [5] * 65])
    assert exc.value.field == "input[1]"
    with pytest.raises(InvalidRequest, match="outside the vocabulary"):
        backend.embed_batch([[backend.tokenizer.vocab_size]])
    with pytest.raises(InvalidRequest, match="empty"):
        backend.embed_batch([[]])
    for text_not_ids in (["The cat sat"], [["The", "cat"]], [[1.5, 2]]):  # ints only, text encoded first
        with pytest.raises(InvalidRequest, match="list of token ids") as exc:
            backend.embed_batch(text_not_ids)
        assert exc.value.field == "input"


def test_embeddings_leave_generation_untouched(backend):
    prompt = backend.tokenizer.encode("Once upon a time")
    params = GenerationParams(max_tokens=8, temperature=0.0)

    def greedy() -> list[int]:
        out = []
        for tok in backend.generate(prompt, params):
            out.append(tok.token_id)
            if len(out) == params.max_tokens:
                break
        return out

    before = greedy()
    backend.embed_batch(ids_of(backend, TEXTS))
    assert greedy() == before


def test_close_frees_the_embeddings_context(model_path, test_options):
    b = LlamaCppBackend.load(ModelSource.from_path(model_path), {**test_options, "embedding_tokens": 32})
    b.embed_batch([[1, 2, 3]])
    embedder = b._handles.embedder
    b.close()
    assert b._handles.embedder is None and embedder._context.closed


def test_packed_runs_respect_tokens_and_sequences():
    assert list(packed_runs([3, 3, 3], max_tokens=6, max_sequences=8)) == [(0, 2), (2, 3)]
    assert list(packed_runs([1] * 5, max_tokens=100, max_sequences=2)) == [(0, 2), (2, 4), (4, 5)]
    assert list(packed_runs([6, 1], max_tokens=6, max_sequences=8)) == [(0, 1), (1, 2)]
    assert list(packed_runs([], max_tokens=6, max_sequences=8)) == []
