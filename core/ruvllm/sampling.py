"""The one sampler: every backend that exposes logits samples through it.

Keeping sampling in core means greedy, seeded sampling, penalties and logprobs behave the same
on every engine, and an engine only has to produce logits. NumPy on one logits row costs well
under a millisecond for a 50k vocabulary, even with nucleus sampling, because the nucleus is
looked for among the top candidates first and the full sort only happens when it is wider.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ruvllm.types import GenerationParams, SampledToken

_NUCLEUS_PROBE = 1024


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


class Sampler:
    """Chooses the next token of one request from its logits row.

    Holds the request's random generator (seeded when ``params.seed`` is set) and the token
    counts the penalties need, so one instance serves exactly one request.
    """

    def __init__(self, params: GenerationParams, vocab_size: int, prompt_ids: Sequence[int] = ()):
        self.params = params
        self._rng = np.random.default_rng(params.seed)
        self._counts: np.ndarray | None = None
        self._seen: np.ndarray | None = None
        if params.has_penalties:
            self._counts = np.zeros(vocab_size, dtype=np.int32)
            self._seen = np.zeros(vocab_size, dtype=bool)
            ids = np.asarray([t for t in prompt_ids if 0 <= t < vocab_size], dtype=np.int64)
            self._seen[ids] = True

    def sample(self, logits: np.ndarray) -> SampledToken:
        """Pick a token from a 1-D logits row (any float dtype) and record it."""
        raw = np.asarray(logits, dtype=np.float32)
        p = self.params
        scores = self._penalised(raw) if self._counts is not None else raw
        token = int(np.argmax(scores)) if p.greedy else self._draw(scores / np.float32(p.temperature))
        self._record(token)
        return self._with_logprobs(token, raw)

    def _penalised(self, raw: np.ndarray) -> np.ndarray:
        p = self.params
        assert self._counts is not None and self._seen is not None
        scores = raw.copy()
        vocab = min(len(scores), len(self._counts))
        if p.repetition_penalty != 1.0:
            seen = np.flatnonzero(self._seen[:vocab])
            vals = scores[seen]
            scores[seen] = np.where(
                vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty
            )
        if p.frequency_penalty or p.presence_penalty:
            counts = self._counts[:vocab]
            scores[:vocab] -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0)
        return scores

    def _draw(self, scores: np.ndarray) -> int:
        p = self.params
        if p.top_k and p.top_k < len(scores):
            candidates = np.argpartition(scores, -p.top_k)[-p.top_k :]
        else:
            candidates = None
        cand_scores = scores if candidates is None else scores[candidates]
        probs = np.exp(cand_scores - cand_scores.max())
        if p.min_p > 0.0:
            # The best candidate has probability weight exp(0) = 1 after the shift above.
            probs[probs < p.min_p] = 0.0
        # ``order`` maps positions in the cdf back to candidate positions (None: identity).
        order = None
        if p.top_p < 1.0:
            order, cdf = _nucleus(probs, p.top_p)
        else:
            cdf = np.cumsum(probs, dtype=np.float64)
        idx = int(np.searchsorted(cdf, self._rng.random() * cdf[-1], side="right"))
        idx = min(idx, len(cdf) - 1)
        if order is not None:
            idx = int(order[idx])
        return int(idx if candidates is None else candidates[idx])

    def _record(self, token: int) -> None:
        if self._counts is not None and token < len(self._counts):
            self._counts[token] += 1
            assert self._seen is not None
            self._seen[token] = True

    def _with_logprobs(self, token: int, raw: np.ndarray) -> SampledToken:
        n = self.params.logprobs
        if n is None:
            return SampledToken(token_id=token)
        lp = log_softmax(raw)
        top: tuple[tuple[int, float], ...] = ()
        # A vocabulary smaller than the request (tiny test models) reports every token.
        n = min(n, len(lp))
        if n > 0:
            best = np.argpartition(lp, -n)[-n:]
            best = best[np.argsort(-lp[best])]
            top = tuple((int(i), float(lp[i])) for i in best)
        return SampledToken(token_id=token, logprob=float(lp[token]), top_logprobs=top)


def _nucleus(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest set of tokens whose probability mass reaches ``top_p``.

    Returns their indices in ``probs`` (which may be unnormalised), most probable first, and
    the cumulative distribution over them, which the draw reuses. Real next-token distributions
    put that mass on a few tokens, so the set is looked for among the top 1024, then the top
    8192 candidates (a partial partition each); the whole vocabulary is sorted only when the
    nucleus is wider still (a nearly flat distribution).
    """
    # float64 sums: a float32 running sum over ~50k small probabilities drifts by ~1e-3, which
    # moves the nucleus boundary by dozens of tokens.
    total = float(probs.sum(dtype=np.float64))
    n = len(probs)
    for probe in (_NUCLEUS_PROBE, 8 * _NUCLEUS_PROBE, n):
        probe = min(probe, n)
        head = np.argpartition(probs, -probe)[-probe:] if probe < n else np.arange(n)
        head = head[np.argsort(-probs[head])]
        cum = np.cumsum(probs[head], dtype=np.float64) / total
        if cum[-1] >= top_p or probe == n:
            break
    keep = min(int(np.searchsorted(cum, top_p)) + 1, len(head))
    return head[:keep], cum[:keep]
