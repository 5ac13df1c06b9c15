"""The real candle_like backend with one executor bug injected (see llamacpp_mutants.py).

candle_like keeps KV in pages the engine owns: a freed sequence's blocks go back to the pool
with their contents, and batched decode pads shorter sequences to the longest one. The validity
mask is what keeps those padding positions (slot 0 of the pool: KV of whichever request wrote
it last) out of attention; this mutant drops it, so short sequences in a batch attend to stale
KV of other requests. Solo runs never pad and stay correct, so only the batched-isolation test
can see the bug, through real numerics.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import ruvllm_candle_like.executor as paged
from ruvllm.executor import BatchEntry
from ruvllm_candle_like.backend import CandleLikeBackend

_masked_attention = paged.attend_decode_batch


def _unmasked_attention(q, k, v, valid):
    return _masked_attention(q, k, v, None)


class _UnmaskedExecutor(paged.PagedExecutor):
    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        paged.attend_decode_batch = _unmasked_attention
        try:
            return super().execute(batch)
        finally:
            paged.attend_decode_batch = _masked_attention


class UnmaskedPaddingCandleLikeBackend(CandleLikeBackend):
    """candle_like whose batched decode attends to padding slots holding stale KV."""

    name: ClassVar[str] = "candle_like-unmasked-padding"

    def create_executor(self, *, max_sequences: int, block_size: int) -> paged.PagedExecutor:
        executor = super().create_executor(max_sequences=max_sequences, block_size=block_size)
        executor.__class__ = _UnmaskedExecutor
        return executor
