"""llama.cpp's DRY ("don't repeat yourself") sampler, rule for rule (its port of koboldcpp's).

A token that would extend a sequence already seen earlier in the context (the prompt's too) is
penalised by ``multiplier * base ** (length - allowed_length)`` once the repeated sequence is at
least ``allowed_length`` tokens long; a sequence breaker (by default a newline, ``:``, ``"``
and ``*``) ends the repetition a match may span. Breakers are strings: a token whose text holds
one is a breaker alone, and a token whose text ends with the start of one is a breaker when the
tokens of the rest follow it (llama.cpp's "restart sequences", found once per vocabulary and
breaker list). Runs on the logits, before the other filters, as llama-server's chain places it.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence

import numpy as np

from ruvllm.tokenizer import Tokenizer

#: llama.cpp's limits on one breaker: characters kept, and tokens of its tail.
MAX_BREAKER_CHARS = 40
MAX_TAIL_TOKENS = 20
#: ln(float32 max): the exponent beyond which ``base ** exponent`` overflows.
_FLOAT_MAX_LOG = 88.7228391

#: head token -> the tails that complete a restart sequence after it (``()``: the head alone).
Breakers = dict[int, tuple[tuple[int, ...], ...]]


@functools.lru_cache(maxsize=8)
def restart_sequences(tokenizer: Tokenizer, breakers: tuple[str, ...]) -> Breakers:
    """llama.cpp's ``get_overlapping_token_sequences`` over the whole vocabulary, per breaker."""
    found: dict[int, list[tuple[int, ...]]] = {}
    words = [tokenizer.token_text(t) for t in range(tokenizer.vocab_size)]
    for breaker in breakers:
        breaker = breaker[:MAX_BREAKER_CHARS]
        if not breaker:
            continue
        for token, word in enumerate(words):
            tails = found.setdefault(token, [])
            if breaker in word:
                if () not in tails:
                    tails.append(())
                continue
            pos = word.find(breaker[0])
            while pos != -1:
                matched = 1
                while (matched < len(breaker) and pos + matched < len(word)
                       and word[pos + matched] == breaker[matched]):
                    matched += 1
                if pos + matched == len(word):  # the word ends with the breaker's start
                    tail = tuple(tokenizer.encode(breaker[matched:], add_special=False)[:MAX_TAIL_TOKENS])
                    if tail not in tails:
                        tails.append(tail)
                pos = word.find(breaker[0], pos + 1)
    return {token: tuple(tails) for token, tails in found.items() if tails}


def penalised(scores: np.ndarray, history: Sequence[int], breakers: Breakers, *, multiplier: float,
              base: float, allowed_length: int, last_n: int) -> np.ndarray:
    """``scores`` less DRY's penalties after ``history`` (prompt and output tokens, oldest first;
    ``last_n``: how many of the last it reads, -1 all)."""
    if multiplier == 0 or base < 1 or last_n == 0:
        return scores
    n = len(history) if last_n == -1 else min(len(history), last_n)
    if n <= allowed_length:
        return scores
    recent = list(history[len(history) - n:])

    def rat(i: int) -> int:  # the i-th token from the end
        return recent[n - 1 - i]

    # Step 1: the nearest restart sequence bounds how far back a repetition may reach.
    limit = n
    for i in range(n):
        longest = -1
        for tail in breakers.get(rat(i), ()):
            if longest < len(tail) <= i and all(tail[k] == rat(i - k - 1) for k in range(len(tail))):
                longest = len(tail)
        if longest >= 0:
            limit = i - longest
            break
    if limit < allowed_length:
        return scores
    # Step 2: repeat[last - k]: how many tokens before position k from the end repeat the context's
    # last tokens (the reversed Z-algorithm, bounded by ``limit``).
    repeat = [0] * n
    last, lt, rt = n - 1, 0, 0
    for k in range(1, n):
        if k > rt:
            m = 0
            while m + k < n and rat(m) == rat(m + k):
                m += 1
            repeat[last - k] = min(m, limit)
            if m > 0:
                lt, rt = k, k + m - 1
        else:
            p, right = k - lt, rt - k + 1
            if repeat[last - p] < right:
                repeat[last - k] = min(repeat[last - p], limit)
            else:
                i = rt + 1
                while i < n and rat(i) == rat(i - k):
                    i += 1
                repeat[last - k] = min(i - k, limit)
                lt, rt = k, i - 1
    # Step 3: the token after each repeat would extend it; keep each token's longest.
    longest_after: dict[int, int] = {}
    for i in range(n - 1):
        if repeat[i] >= allowed_length:
            token = rat(n - 2 - i)
            longest_after[token] = max(longest_after.get(token, 0), repeat[i])
    # Step 4: the penalty, for every such token that is not a breaker on its own.
    max_exponent = int(_FLOAT_MAX_LOG / math.log(base)) if base > 1.000001 else 0
    out = scores
    for token, length in longest_after.items():
        if token >= len(scores) or () in breakers.get(token, ()):
            continue
        exponent = length - allowed_length
        if max_exponent > 0:
            exponent = min(exponent, max_exponent)
        if out is scores:
            out = scores.copy()
        out[token] -= np.float32(multiplier * base ** exponent)
    return out
