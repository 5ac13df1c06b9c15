"""Prompt logprobs (OpenAI's ``echo`` + ``logprobs``; lm-eval's loglikelihood) from prefill logits.

A request that asks for them has every prefill chunk run with ``BatchEntry.all_logits``: the
executor returns one logits row per prompt position, and row ``p`` is the model's distribution
for token ``p + 1``. Each row is reduced to the logprob of the token that follows (and the top
alternatives) as soon as it arrives, so a long prompt never holds ``len(prompt) x vocab``
floats. Positions served from the prefix cache would have no logits, so such a request never
reuses cached KV (the scheduler's ``reuse_prefix``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ruvllm.errors import InvalidRequest
from ruvllm.sampling import log_softmax, top_logprobs
from ruvllm.tokenizer import Tokenizer, require_in_vocabulary
from ruvllm.types import GenerationParams, PromptLogprob, TokenLogprob


def check_logits_options(params: GenerationParams, *, path: str, backend: str, vocab_size: int,
                         executor: Any) -> None:
    """Refuse ``logit_bias`` / ``allowed_token_ids`` / ``bad_words`` / ``min_tokens`` /
    ``prompt_logprobs`` a request cannot have, naming the reason."""
    if params.logit_bias:
        require_in_vocabulary("logit_bias", (t for t, _ in params.logit_bias), vocab_size)
        if path != "executor":
            raise InvalidRequest(
                "logit_bias", f"backend {backend!r} samples inside its own engine (request-level "
                "path), so ruvllm's sampler cannot apply a logit bias; remove logit_bias or use a "
                "backend with an executor (see `ruvllm backends`)")
    if params.allowed_token_ids:
        require_in_vocabulary("allowed_token_ids", params.allowed_token_ids, vocab_size)
    for name, value in (("allowed_token_ids", params.allowed_token_ids),
                        ("bad_words", params.banned_sequences)):
        if value and path != "executor":
            raise InvalidRequest(
                name, f"backend {backend!r} samples inside its own engine (request-level path), so "
                f"ruvllm's sampler cannot keep tokens out; remove {name} or use a backend with an "
                "executor (see `ruvllm backends`)")
    if params.min_tokens and path != "executor":
        raise InvalidRequest(
            "min_tokens", f"backend {backend!r} samples inside its own engine (request-level path), "
            "so ruvllm's sampler cannot keep the end of the answer out; remove min_tokens or use a "
            "backend with an executor (see `ruvllm backends`)")
    if params.prompt_logprobs is not None and (path != "executor"
                                               or not getattr(executor, "prompt_logits", False)):
        raise InvalidRequest(
            "prompt_logprobs", f"backend {backend!r} cannot return the logits of prompt positions "
            "(it runs whole requests and reports only sampled tokens), so prompt logprobs (echo "
            "with logprobs) are unavailable; use a backend with an executor (see `ruvllm backends`)")


class PromptLogprobsCollector:
    """Accumulates one request's prompt logprobs, position by position, on the model thread."""

    def __init__(self, prompt_ids: Sequence[int], top_n: int, tokenizer: Tokenizer):
        self._prompt = tuple(int(t) for t in prompt_ids)
        self._top_n = top_n
        self._tok = tokenizer
        # _entries[p]: (logprob of prompt[p + 1], its rank, top (id, logprob) pairs) from row p.
        self._entries: list[tuple[float, int, tuple[tuple[int, float], ...]] | None] = \
            [None] * max(len(self._prompt) - 1, 0)
        self._missing = len(self._entries)

    @property
    def complete(self) -> bool:
        return self._missing == 0

    def wants(self, start_pos: int, num_tokens: int) -> bool:
        """Whether a chunk over ``[start_pos, start_pos + num_tokens)`` holds positions still
        needed (every position but the prompt's last, whose row is the first sample)."""
        end = min(start_pos + num_tokens, len(self._entries))
        return any(self._entries[p] is None for p in range(start_pos, end))

    def add(self, start_pos: int, rows: np.ndarray) -> None:
        """Record the rows of positions ``start_pos ..`` (one row each, as the executor gave)."""
        for offset in range(len(rows)):
            p = start_pos + offset
            if p >= len(self._entries):
                break
            if self._entries[p] is not None:
                continue  # recomputed after a preemption: the first answer stands
            lp = log_softmax(np.asarray(rows[offset], dtype=np.float32))
            token = self._prompt[p + 1]
            rank = 1 + int(np.count_nonzero(lp > lp[token]))
            self._entries[p] = (float(lp[token]), rank, top_logprobs(lp, self._top_n))
            self._missing -= 1

    def result(self) -> tuple[PromptLogprob | None, ...] | None:
        """One entry per prompt token (None for the first), or None if prefill did not finish."""
        if not self.complete:
            return None
        text = self._tok.token_text
        out: list[PromptLogprob | None] = [None]
        for p, entry in enumerate(self._entries):
            assert entry is not None
            logprob, rank, top = entry
            token = self._prompt[p + 1]
            out.append(PromptLogprob(
                token_id=token, text=text(token), logprob=logprob, rank=rank,
                top_logprobs=tuple(TokenLogprob(i, text(i), v) for i, v in top)))
        return tuple(out)
