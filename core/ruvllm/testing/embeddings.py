"""Checks for ``LlmBackend.embed_batch`` results, shared by every backend's embeddings tests.

What any mean-pooled embedding of a language model must show, whatever its kernels: unit rows,
paraphrases closer than unrelated sentences, and the same direction for the same input whatever
it is batched with.
"""

from __future__ import annotations

import numpy as np

#: Two paraphrases (0, 1) and two sentences on another topic (2, 3).
TOPIC_TEXTS = ("The cat sat on the mat.", "A kitten was sitting on the rug.",
               "Quarterly revenue grew by twelve percent.", "The stock market fell sharply today.")
#: An input alone and inside a batch: kernels may block the work differently for another batch
#: shape (llama.cpp moved single components by up to 9e-4), so vectors must point the same way
#: within cos >= 0.9999 (0.8 degrees), not be equal.
MIN_BATCH_COSINE = 0.9999
#: By how much the paraphrases' cosine must beat every cross-topic pair (SmolLM2-135M: ~0.93
#: against ~0.71).
TOPIC_MARGIN = 0.05


def assert_unit_rows(vectors: np.ndarray, dim: int | None = None) -> None:
    assert vectors.dtype == np.float32, vectors.dtype
    if dim is not None:
        assert vectors.shape[1] == dim, vectors.shape
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def assert_separates_topics(vectors: np.ndarray) -> None:
    """``vectors``: the unit embeddings of :data:`TOPIC_TEXTS`, in order."""
    sim = vectors @ vectors.T
    cross = max(sim[0, 2], sim[0, 3], sim[1, 2], sim[1, 3])
    assert sim[0, 1] > cross + TOPIC_MARGIN, sim
    assert sim[2, 3] > max(sim[0, 2], sim[1, 3]) + TOPIC_MARGIN, sim


def assert_same_direction(a: np.ndarray, b: np.ndarray, min_cosine: float = MIN_BATCH_COSINE) -> None:
    """Rows of the unit vectors ``a`` and ``b`` agree within ``min_cosine``."""
    cos = (np.atleast_2d(a) * np.atleast_2d(b)).sum(axis=-1)
    assert np.all(cos >= min_cosine), cos
