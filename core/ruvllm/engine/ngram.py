"""Prompt lookup: draft tokens by copying what followed an earlier occurrence of the text's tail.

vLLM's ``ngram`` method (and llama.cpp's lookup decoding): the last ``n`` tokens of a request's
prompt + output, for the largest ``n`` in ``[prompt_lookup_min, prompt_lookup_max]`` that occurs
earlier in it, most recent occurrence first, and the tokens that followed that occurrence are
the draft. Input-grounded work (a summary quoting its source, a code edit copying most of its
input) repeats long spans, so the drafts are often right; free text rarely matches.

The index is built incrementally (each token is indexed once, by the ``prompt_lookup_min``-gram
ending before it), so a proposal costs a dictionary lookup and a short backward comparison per
candidate, not a scan of the whole context every step.
"""

from __future__ import annotations

from collections.abc import Sequence

#: Earlier occurrences compared per proposal (most recent first): bounds the cost on text that
#: repeats one short n-gram hundreds of times.
MAX_CANDIDATES = 32


class PromptLookup:
    """One request's n-gram index over its own tokens (prompt + output)."""

    def __init__(self, min_n: int, max_n: int):
        self.min_n = min_n
        self.max_n = max_n
        #: ``min_n``-gram -> positions of the token that followed each occurrence, ascending.
        self._follows: dict[tuple[int, ...], list[int]] = {}
        self._indexed = min_n

    def propose(self, tokens: Sequence[int], k: int) -> tuple[tuple[int, ...], int]:
        """Up to ``k`` tokens predicted to follow ``tokens``, and the length of the matched tail
        (``((), 0)`` when the tail occurs nowhere earlier). ``tokens`` only ever grows between
        calls (a request's history)."""
        end = len(tokens)
        if k < 1 or end <= self.min_n:
            return (), 0
        self._index(tokens)
        tail = tuple(tokens[end - self.min_n:])
        best, best_len = -1, 0
        for follow in reversed(self._follows.get(tail, ())[-MAX_CANDIDATES:]):
            n = self.min_n
            while n < self.max_n and follow - n - 1 >= 0 and tokens[follow - n - 1] == tokens[end - n - 1]:
                n += 1
            if n > best_len:
                best, best_len = follow, n
                if n == self.max_n:
                    break
        if best < 0:
            return (), 0
        return tuple(tokens[best:min(best + k, end)]), best_len

    def _index(self, tokens: Sequence[int]) -> None:
        """Index every position whose following token is known and whose n-gram is not the tail."""
        n = self.min_n
        for follow in range(self._indexed, len(tokens)):
            self._follows.setdefault(tuple(tokens[follow - n:follow]), []).append(follow)
        self._indexed = max(self._indexed, len(tokens))
