"""The pattern bank: clusters of prompt embeddings, each with the adapter learned for them.

The deep loop clusters the embeddings of well-rated prompts (k-means, cosine geometry) and
stores each centroid with the adapter those prompts were learned into. A new request is routed
to the nearest pattern's adapter when its prompt is similar enough (cosine >= threshold).
"""

from __future__ import annotations

import threading

import attrs
import numpy as np


@attrs.frozen(kw_only=True)
class Pattern:
    centroid: np.ndarray  # unit vector
    adapter: str
    size: int
    mean_score: float


def _unit(x: np.ndarray) -> np.ndarray:
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.maximum(n, 1e-12)


def kmeans(points: np.ndarray, k: int, *, iters: int = 20, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Spherical k-means: unit centroids [k', D] and each point's cluster (k' <= k)."""
    x = _unit(points.astype(np.float64))
    k = max(1, min(k, len(x)))
    rng = np.random.default_rng(seed)
    # k-means++ seeding on cosine distance.
    centroids = [x[rng.integers(len(x))]]
    for _ in range(1, k):
        d = 1.0 - np.max(x @ np.stack(centroids).T, axis=1)
        d = np.maximum(d, 0)
        if d.sum() <= 0:
            break
        centroids.append(x[rng.choice(len(x), p=d / d.sum())])
    c = np.stack(centroids)
    assign = np.zeros(len(x), dtype=np.int64)
    for _ in range(iters):
        assign = np.argmax(x @ c.T, axis=1)
        new = np.stack([x[assign == j].mean(axis=0) if np.any(assign == j) else c[j] for j in range(len(c))])
        new = _unit(new)
        if np.allclose(new, c):
            break
        c = new
    return c, assign


class PatternBank:
    def __init__(self, threshold: float):
        self.threshold = threshold
        self._patterns: tuple[Pattern, ...] = ()
        self._matrix: np.ndarray | None = None
        self._lock = threading.Lock()

    @property
    def patterns(self) -> tuple[Pattern, ...]:
        return self._patterns

    def replace(self, patterns: list[Pattern]) -> set[str]:
        """Route by ``patterns`` from now on (one swap: a concurrent route sees the old bank or the
        new one); returns the adapters the old patterns pointed at."""
        matrix = np.stack([p.centroid for p in patterns]) if patterns else None
        with self._lock:
            old = {p.adapter for p in self._patterns}
            self._patterns, self._matrix = tuple(patterns), matrix
        return old

    def clear(self) -> None:
        with self._lock:
            self._patterns, self._matrix = (), None

    def nearest(self, embedding: np.ndarray) -> tuple[Pattern, float] | None:
        """The most similar pattern and its cosine similarity, or None when the bank is empty."""
        matrix, patterns = self._matrix, self._patterns
        if matrix is None:
            return None
        sims = matrix @ _unit(np.asarray(embedding, dtype=np.float64))
        j = int(np.argmax(sims))
        return patterns[j], float(sims[j])

    def route(self, embedding: np.ndarray) -> str | None:
        hit = self.nearest(embedding)
        if hit is None or hit[1] < self.threshold:
            return None
        return hit[0].adapter
