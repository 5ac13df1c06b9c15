"""The rate ratio SONA's benchmark reports, and its bootstrap confidence interval.

A cell is one held-out prompt under one seed: whether the base model's answer and the variant's
answer (same prompt, same sampling seed) showed the behaviour. The ratio is the variant's rate over
the base rate; its 95 % interval resamples cells with replacement (scipy's paired percentile
bootstrap), so it carries the spread over both prompts and seeds.
"""

from __future__ import annotations

import attrs
import numpy as np
from scipy.stats import bootstrap


@attrs.frozen
class Ratio:
    rate: float
    base_rate: float
    ratio: float
    low: float
    high: float


def _ratio(variant: np.ndarray, base: np.ndarray, axis: int = -1) -> np.ndarray:
    # A resample without a single base hit has an unbounded ratio: inf, which the percentile keeps.
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(base.sum(axis=axis) > 0, variant.sum(axis=axis) / base.sum(axis=axis), np.inf)


def rate_ratio(variant: np.ndarray, base: np.ndarray, *, seed: int = 0, resamples: int = 4000) -> Ratio:
    """``variant`` / ``base``: 0/1 per cell, paired (same prompt and seed at the same index)."""
    v = np.asarray(variant, dtype=np.float64).ravel()
    b = np.asarray(base, dtype=np.float64).ravel()
    point = float(_ratio(v, b))
    with np.errstate(invalid="ignore"):  # the standard error of resamples that include inf
        ci = bootstrap((v, b), _ratio, paired=True, vectorized=True, n_resamples=resamples,
                       method="percentile", random_state=np.random.default_rng(seed)).confidence_interval
    return Ratio(rate=float(v.mean()), base_rate=float(b.mean()), ratio=point, low=float(ci.low),
                 high=float(ci.high))
