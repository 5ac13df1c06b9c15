"""llama.cpp's other samplers, rule for rule: locally typical sampling, top-n-sigma, XTC and the
dynamic temperature (its ``temp-ext``).

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
