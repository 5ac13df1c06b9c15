"""The per-request constraint: a logits processor that masks what the grammar forbids.

It plugs into core's :class:`ruvllm.sampling.Sampler` like any other logits processor, so every
backend that samples in core (llamacpp, candle_like, mlx on the executor path) is constrained
by the same code. Before each choice it feeds the matcher the tokens sampled since its last
call, then takes the step's mask: the one :mod:`ruvllm.guided.batch` computed for all
constrained rows of the step while the forward pass ran, or, outside the engine's step (a
plain ``Sampler``), one computed here. The matcher and the mask come from the request's grammar
engine (:mod:`ruvllm.guided.engine`: llguidance or xgrammar); everything here is engine-neutral.
"""

from __future__ import annotations

import concurrent.futures
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from ruvllm.guided.fork_guard import library_call

if TYPE_CHECKING:
    from ruvllm.guided.engine import GrammarEngine, GuidedMatcher
    from ruvllm.guided.grammar import GrammarSpec

log = logging.getLogger(__name__)


def mask_words(vocab_size: int) -> int:
    """int32 words of one bitmask row (both engines' layout: bit i%32 of word i//32 is token i)."""
    return (vocab_size + 31) // 32


def allowed_from_bitmask(row: np.ndarray, vocab_size: int) -> np.ndarray:
    """Boolean "allowed" per token id from one int32 bitmask row."""
    bits = np.unpackbits(np.ascontiguousarray(row).view(np.uint8), bitorder="little")
    return bits[:vocab_size].astype(bool)


class GuidedProcessor:
    """Logits processor enforcing one grammar matcher (one request, one instance)."""

    def __init__(self, matcher: GuidedMatcher, engine: GrammarEngine, vocab_size: int,
                 eos_ids: Sequence[int] = (), *, kind: str = "", recipe: GrammarSpec | None = None):
        self.matcher = matcher
        self.engine = engine
        self.vocab_size = vocab_size
        self.eos_ids = tuple(eos_ids)
        self.kind = kind
        #: The grammar this processor was built from (a small frozen attrs value, picklable):
        #: the matcher is native state bound to this process, so a request that samples in
        #: another process (``ruvllm serve --ray``) sends the recipe, and that process rebuilds
        #: the processor with ``guided_processor(recipe, its tokenizer, ...)``. None for a
        #: processor built by hand, which cannot be rebuilt elsewhere.
        self.recipe = recipe
        self._consumed = 0
        self._pending: tuple[concurrent.futures.Future, np.ndarray, int] | None = None
        self._warned = False

    def sync(self, output_ids: Sequence[int]) -> None:
        """Feed the matcher every token sampled since the last call."""
        for token in output_ids[self._consumed:]:
            with library_call():
                consumed = self.matcher.consume_token(int(token))
            if not consumed and not self._warned:
                self._warned = True
                log.warning("guided decoding (%s, %s): token %d broke the grammar: %s", self.kind,
                            self.engine.name, token, self.matcher.error())
        self._consumed = len(output_ids)

    def expect_mask(self, future: concurrent.futures.Future, bitmask: np.ndarray, row: int) -> None:
        """The step's batched mask computation will fill ``bitmask[row]`` once ``future`` is done."""
        self._pending = (future, bitmask, row)

    def mask(self, output_ids: Sequence[int]) -> np.ndarray:
        """This step's bitmask row (computed now unless the step's batch already did)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            future, bitmask, row = pending
            future.result()
            return bitmask[row]
        self.sync(output_ids)
        bitmask = np.full((1, mask_words(self.vocab_size)), -1, dtype=np.int32)
        with library_call():
            self.engine.fill_masks([self.matcher], bitmask, [0])
        return bitmask[0]

    def __call__(self, output_ids: Sequence[int], logits: np.ndarray) -> np.ndarray:
        allowed = allowed_from_bitmask(self.mask(output_ids), self.vocab_size)
        n = min(len(logits), len(allowed))
        if not allowed[:n].any():
            # A matcher in an error state allows nothing: end the request rather than emit noise.
            allowed = np.zeros(n, dtype=bool)
            allowed[[e for e in self.eos_ids if e < n]] = True
        out = np.full_like(logits, -np.inf)
        keep = np.flatnonzero(allowed[:n])
        out[keep] = logits[keep]
        return out
