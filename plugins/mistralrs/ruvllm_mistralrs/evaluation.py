"""Quality measurements through mistral.rs: log-likelihood and perplexity of a fixed text.

The binding has no "score these tokens" call; it reports the log-probability of each token it
samples. mistral.rs computes that log-probability from the model's distribution *before* the
request's logit bias is applied, so forcing token ``t`` with a large bias makes mistral.rs
sample ``t`` and report ``log p(t | prefix)`` under the unbiased model (the tests check this
against the top-logprobs list). One short request per position: fine for the short texts the
ISQ quality check uses.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ruvllm.errors import InvalidRequest

#: Large enough to make the forced token win, finite so the logits stay well defined.
FORCE_BIAS = 1.0e4


def forced_logprobs(backend: Any, prefix_ids: Sequence[int], target_ids: Sequence[int]) -> list[float]:
    """``log p(target[i] | prefix + target[:i])`` for every i, greedy, no adapter."""
    if not prefix_ids:
        raise InvalidRequest("prefix_ids", "needs at least one token to condition on")
    m = backend._m
    out: list[float] = []
    context = list(prefix_ids)
    for target in target_ids:
        text = backend.tokenizer.decode(context, skip_special=False)
        request = m.ChatCompletionRequest(
            messages=[{"role": "user", "content": text}], model="default", max_tokens=1,
            temperature=0.0, stream=True, logprobs=True, top_logprobs=1, ignore_eos=True,
            logit_bias={int(target): FORCE_BIAS},
        )
        stream, first = backend._submit(context, text, request)
        chunks = ([first] if first is not None else []) + [c for c in stream]
        del stream
        lps = [c.choices[0].logprobs for c in chunks if c.choices and c.choices[0].logprobs is not None]
        token = backend._token_of(lps[0], _GREEDY)
        if token.token_id != target:
            raise RuntimeError(f"forcing token {target} produced {token.token_id}")
        out.append(float(lps[0].logprob))
        context.append(int(target))
    return out


def perplexity(logprobs: Sequence[float]) -> float:
    return math.exp(-sum(logprobs) / len(logprobs))


def _greedy() -> Any:
    from ruvllm.types import GenerationParams

    return GenerationParams(max_tokens=1, temperature=0.0)


_GREEDY = _greedy()
