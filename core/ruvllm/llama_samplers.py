"""llama.cpp's other samplers, rule for rule: locally typical sampling, top-n-sigma, XTC, the
dynamic temperature (its ``temp-ext``) and Mirostat (1 and 2).

They run in llama.cpp's order only (``GenerationParams.temperature_last``: the filters choose
among the model's own probabilities, the temperature comes last), the order llama-server's
clients tune them for: top-n-sigma over the whole row before top-k, typical before top-p, XTC
after min-p, the dynamic temperature in the temperature's place. Each function reproduces
llama.cpp's ``llama_sampler_*_apply`` on ruvllm's arrays (``probs``: the candidates' weights,
any scale).
"""

from __future__ import annotations

import numpy as np


def top_n_sigma(scores: np.ndarray, n: float) -> np.ndarray:
    """``scores`` with every logit below ``max - n * std`` at -inf, the mean and standard
    deviation taken over the finite logits of the whole row (llama.cpp runs it first)."""
    finite = scores[np.isfinite(scores)]
    if n <= 0 or len(finite) <= 1:
        return scores
    threshold = finite.max() - n * float(finite.std())
    return np.where(scores < threshold, np.float32(-np.inf), scores)


def typical(probs: np.ndarray, p: float) -> np.ndarray:
    """Indices (into ``probs``) of the locally typical tokens: ordered by how far each token's
    surprise is from the distribution's entropy, the fewest whose mass exceeds ``p``."""
    total = probs.sum(dtype=np.float64)
    q = probs / total
    with np.errstate(divide="ignore", invalid="ignore"):
        surprise = -np.log(q)
        entropy = float(np.nansum(q * surprise))
    order = np.argsort(np.abs(surprise - entropy), kind="stable")
    cum = np.cumsum(q[order])
    last = int(np.searchsorted(cum, p, side="right")) + 1  # the first cumulative mass above p
    return order[:min(last, len(order))]


def xtc(kept: np.ndarray, probs: np.ndarray, threshold: float, chance: float,
        probability: float) -> np.ndarray:
    """XTC ("exclude top choices"): with ``probability`` (``chance`` is the draw), every token of
    ``kept`` at least ``threshold`` probable is dropped but the least probable of them, when two
    or more are; a threshold above 0.5 never drops anything (only one token can pass it)."""
    if probability <= 0 or threshold > 0.5 or len(kept) < 2 or chance > probability:
        return kept
    q = probs[kept] / probs[kept].sum(dtype=np.float64)
    order = np.argsort(-q, kind="stable")
    above = int(np.count_nonzero(q[order] >= threshold))
    if above < 2:
        return kept
    return kept[order[above - 1:]]


def dynamic_temperature(weights: np.ndarray, temperature: float, spread: float, exponent: float) -> float:
    """llama.cpp's ``temp-ext``: a temperature in ``[temperature - spread, temperature + spread]``
    (not below 0), higher the closer the candidates' entropy is to its maximum, shaped by
    ``exponent``."""
    if spread <= 0 or len(weights) <= 1:
        return temperature
    q = weights / weights.sum(dtype=np.float64)
    q = q[q > 0]
    entropy = float(-(q * np.log(q)).sum())
    normalised = entropy / float(np.log(len(weights)))
    low, high = max(0.0, temperature - spread), temperature + spread
    return low + (high - low) * normalised ** exponent


class Mirostat:
    """Mirostat's state for one request: the surprise bound ``mu`` (2 tau at the start), moved
    towards the target surprise ``tau`` by ``eta`` after each token. Version 2 keeps the tokens
    whose surprise (-log2 p) is within ``mu``; version 1 estimates the distribution's Zipf
    exponent from its ``m`` best tokens and keeps the top k that bound implies. In llama.cpp
    Mirostat replaces the filter chain: it runs on the tempered distribution, nothing else."""

    def __init__(self, version: int, tau: float, eta: float, vocab_size: int, m: int = 100):
        self.version, self.tau, self.eta, self.vocab_size, self.m = version, tau, eta, vocab_size, m
        self.mu = 2.0 * tau

    def choose(self, scores: np.ndarray, temperature: float, uniform: float) -> int:
        """The token drawn from ``scores`` (logits) at ``temperature`` with the uniform draw
        ``uniform``; ``mu`` moves by the token's surprise."""
        finite = np.flatnonzero(np.isfinite(scores))
        if temperature <= 0:  # llama.cpp's temperature 0 keeps the best alone
            return int(finite[np.argmax(scores[finite])])
        logits = scores[finite].astype(np.float64) / temperature
        order = np.argsort(-logits, kind="stable")
        q = np.exp(logits[order] - logits[order[0]])
        q /= q.sum()
        keep = self._kept(q)
        kept = q[:keep] / q[:keep].sum()
        pick = min(int(np.searchsorted(np.cumsum(kept), uniform, side="right")), keep - 1)
        self.mu -= self.eta * (-np.log2(kept[pick]) - self.tau)
        return int(finite[order[pick]])

    def _kept(self, q: np.ndarray) -> int:
        """How many of the sorted probabilities ``q`` the version keeps (at least one)."""
        if self.version == 2:
            return max(1, int(np.count_nonzero(-np.log2(q) <= self.mu)))
        n = min(self.m - 1, len(q) - 1)
        if n < 1:
            return 1
        t = np.log(np.arange(2, n + 2) / np.arange(1, n + 1))
        with np.errstate(divide="ignore", invalid="ignore"):
            b = np.log(q[:n] / q[1:n + 1])
        s_hat = float(np.nansum(t * b) / np.sum(t * t))
        epsilon = s_hat - 1
        with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
            k = ((epsilon * 2.0 ** self.mu) / (1 - float(self.vocab_size) ** -epsilon)) ** (1 / s_hat)
        return max(1, min(len(q), int(k))) if np.isfinite(k) else len(q)
