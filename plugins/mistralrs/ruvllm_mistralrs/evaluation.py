"""Quality measurements through mistral.rs: log-likelihood and perplexity of a fixed text.

The binding has no "score these tokens" call; it reports log-probabilities only for the tokens
it generates. But ``top_logprobs`` may be as large as the vocabulary, so one greedy step over
``prefix + target[:i]`` with every alternative reported gives ``log p(target[i] | ...)`` exactly
(teacher forcing). A logit bias cannot be used to force the token instead: mistral.rs reports
log-probabilities after the bias (the tests check both facts). One short request per position:
fine for the short texts the ISQ quality check uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ruvllm.errors import InvalidRequest


def forced_logprobs(backend: Any, prefix_ids: Sequence[int], target_ids: Sequence[int]) -> list[float]:
    """``log p(target[i] | prefix + target[:i])`` for every i under the unmodified model."""
    if not prefix_ids:
        raise InvalidRequest("prefix_ids", "needs at least one token to condition on")
    m = backend._m
    vocab = backend.tokenizer.vocab_size
    out: list[float] = []
    context = list(prefix_ids)
    for target in target_ids:
        text = backend.tokenizer.decode(context, skip_special=False)
        request = m.ChatCompletionRequest(
            messages=[{"role": "user", "content": text}], model="default", max_tokens=1,
            temperature=0.0, stream=True, logprobs=True, top_logprobs=vocab, ignore_eos=True,
        )
        stream, first = backend._submit(context, text, request)
        chunks = ([first] if first is not None else []) + list(stream)
        del stream
        lp = next(c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs is not None)
        scores = {int(t.token): float(t.logprob) for t in lp.top_logprobs}
        if target not in scores:
            raise RuntimeError(f"token {target} missing from the {len(scores)} log-probabilities returned")
        out.append(scores[target])
        context.append(int(target))
    return out


def perplexity(logprobs: Sequence[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))
