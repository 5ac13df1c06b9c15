"""Recover the id of each token mistral.rs samples.

mistral.rs's Python binding streams text, not token ids. With ``logprobs=True`` every streamed
chunk carries exactly one sampled token with its raw ``bytes`` (not a text delta: a token that
is half a UTF-8 character comes as that half) and its log-probability, plus the top
alternatives *with* their ids. The vocabulary maps bytes to ids; where several ids share the
same bytes (rare: e.g. a special token spelled like ordinary text) the alternative whose id is
among them and whose log-probability equals the sampled token's settles it. Anything left
ambiguous or unknown is an error, never a guess, so the ids core receives are exactly the ids
mistral.rs sampled.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ruvllm.errors import BackendError


class TokenIdResolver:
    def __init__(self, token_bytes: Sequence[bytes]):
        self._ids: dict[bytes, tuple[int, ...]] = {}
        for token_id, raw in enumerate(token_bytes):
            if raw:
                self._ids[raw] = (*self._ids.get(raw, ()), token_id)

    def resolve(self, raw: bytes, logprob: float, top: Sequence[tuple[int, float]]) -> int:
        candidates = self._ids.get(raw, ())
        if len(candidates) == 1:
            return candidates[0]
        matching = {t for t, lp in top if t in candidates and math.isclose(lp, logprob, abs_tol=1e-6)}
        if len(matching) == 1:
            return matching.pop()
        where = "no token" if not candidates else f"tokens {list(candidates)}"
        raise BackendError(
            f"mistral.rs sampled a token whose bytes {raw!r} match {where} of the model's vocabulary "
            f"and its log-probabilities do not single one out; the tokenizer ruvllm built does not "
            f"match the one mistral.rs uses (pass tokenizer_json=... to use the same file)"
        )
