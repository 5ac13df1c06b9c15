"""What one more token in a decode step costs, learnt from the steps the engine runs.

Speculation pays only where verifying a drafted token costs less than the chance it is kept
earns. That price differs by an order of magnitude between executors: llama.cpp's CPU kernels
run a step of 2 tokens in ~1.6x the time of 1 (measured on the 2-core AVX2 machine), while an
fp32 torch forward, bound by reading the weights, barely notices a few more rows. So the price
is measured, not configured: every step made only of decodes (with or without drafts) is one
observation of ``seconds = base + per_token * tokens``, fitted by least squares with
exponential forgetting, so the fit follows a machine whose load changes.
"""

from __future__ import annotations

#: Weight kept by older observations at each new one (a window of ~50 steps).
DECAY = 0.98
#: Relative cost of a drafted token assumed until the fit is determined (llama.cpp-like, so a
#: new engine speculates cautiously until it has seen what drafts cost).
PRIOR_COST = 0.5
#: Observations needed, and their spread in tokens, before the fit is trusted.
MIN_WEIGHT = 8.0
MIN_SPREAD = 0.25


class StepCostModel:
    def __init__(self) -> None:
        self._w = self._n = self._nn = self._t = self._nt = 0.0

    def observe(self, tokens: int, seconds: float) -> None:
        """One decode-only step of ``tokens`` tokens (drafts included) took ``seconds``."""
        d = DECAY
        self._w = d * self._w + 1.0
        self._n = d * self._n + tokens
        self._nn = d * self._nn + tokens * tokens
        self._t = d * self._t + seconds
        self._nt = d * self._nt + tokens * seconds

    def token_cost(self, batch_tokens: int) -> float:
        """What one more token adds to a step of ``batch_tokens`` decode tokens, as a fraction of
        that step's time per token: a drafted token is worth verifying when the chance it is
        kept exceeds this."""
        fit = self._fit()
        if fit is None:
            return PRIOR_COST
        base, per_token = fit
        step = base + per_token * batch_tokens
        return per_token * batch_tokens / step if step > 0 else PRIOR_COST

    def seconds(self, tokens: int) -> float | None:
        """Expected time of a step of ``tokens`` tokens: the fit once it is determined, before
        that the mean time per token observed (steps of one size give no fit), None before any
        observation. A draft model's cost per drafted token is its step time over the target's."""
        fit = self._fit()
        if fit is not None:
            return fit[0] + fit[1] * tokens
        return self._t / self._n * tokens if self._n > 0 else None

    def _fit(self) -> tuple[float, float] | None:
        """``(base, per_token)`` seconds, or None while too few or too alike steps were seen."""
        w, n = self._w, self._n
        variance = w * self._nn - n * n
        if w < MIN_WEIGHT or variance < MIN_SPREAD * w * w:
            return None
        per_token = max((w * self._nt - n * self._t) / variance, 0.0)
        return max((self._t - per_token * n) / w, 0.0), per_token
