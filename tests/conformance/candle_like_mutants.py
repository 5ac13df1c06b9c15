"""The real candle_like backend with one bug injected each (see llamacpp_mutants.py).

- ``UnmaskedPaddingCandleLikeBackend``: candle_like keeps KV in pages the engine owns: a freed
  sequence's blocks go back to the pool with their contents, and batched decode pads shorter
  sequences to the longest one. The validity mask is what keeps those padding positions (slot 0
  of the pool: KV of whichever request wrote it last) out of attention; this mutant drops it, so
  short sequences in a batch attend to stale KV of other requests. Solo runs never pad and stay
  correct, so only the batched-isolation test can see the bug, through real numerics.
- ``MigrationSkipsWriteBackCandleLikeBackend``: the two-tier KV cache under the engine
  (``kv_cache=two_tier``) frees a block's hot slot when the block leaves a sequence's window
  without quantising its K/V into the block's cold rows, as if they were already there (true
  only of blocks a long prefill wrote cold directly). A later read of the block gets whatever
  its cold rows last held: another, finished request's KV, or zeros. Only under the executor,
  only once a block has migrated and is read again: a prefix-cache hit, a prompt prefilled in
  several chunks, a sequence longer than the window.
- ``KeptCachesCandleLikeBackend``: each request's KV cache stays referenced after the call;
  outputs and the backend's own ``cached_tokens()`` are unaffected, only memory grows.
- ``LumpyKeptCachesCandleLikeBackend``: the same leak every third request only, so memory grows
  in lumps with flat calls between them: the median growth per call is 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np
import ruvllm_candle_like.executor as paged
from ruvllm.errors import BackendOptionError
from ruvllm.executor import BatchEntry
from ruvllm_candle_like.backend import CandleLikeBackend
from ruvllm_candle_like.kv_paged_two_tier import PagedTwoTier

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


class _NoWriteBackTwoTier(PagedTwoTier):
    def migrate(self, blocks: np.ndarray) -> None:
        for b in blocks.tolist():  # the slot is freed; the cold rows keep what they held
            self._release(b)


class MigrationSkipsWriteBackCandleLikeBackend(CandleLikeBackend):
    """candle_like whose two-tier executor cache drops a block's hot K/V when it migrates."""

    name: ClassVar[str] = "candle_like-migration-skips-write-back"

    def create_executor(self, *, max_sequences: int, block_size: int) -> paged.PagedExecutor:
        executor = super().create_executor(max_sequences=max_sequences, block_size=block_size)
        if executor.two_tier is None:
            raise BackendOptionError(self.name, "kv_cache", "this mutant's bug is in the two-tier cache",
                                     self.options.kv_cache, fix="run it with kv_cache=two_tier")
        executor.two_tier.__class__ = _NoWriteBackTwoTier
        return executor


class KeptCachesCandleLikeBackend(CandleLikeBackend):
    """candle_like whose per-request KV caches stay referenced after each call (collected in a
    list, as a memory report or a debugging hook might do). Every call still gets a fresh cache,
    so outputs stay isolated, and ``cached_tokens()`` still drops to 0 in ``finally``: only the
    process's memory shows the leak, which is what the suite's RSS probe measures."""

    name: ClassVar[str] = "candle_like-kept-caches"

    def new_cache(self, capacity: int):
        cache = super().new_cache(capacity)
        self.__dict__.setdefault("_kept_caches", []).append(cache)
        return cache


class LumpyKeptCachesCandleLikeBackend(CandleLikeBackend):
    """candle_like keeping the KV cache of every ``EVERY``-th request (a sampling debug hook, or
    a cache put back in a pool that only every few calls forgets to clear): memory grows by one
    cache in one call of three and stays flat in the others. A third of a full leak is above the
    suite's quarter; a rule judging the median growth per call sees 0 and passes it."""

    name: ClassVar[str] = "candle_like-lumpy-kept-caches"
    EVERY: ClassVar[int] = 3

    def new_cache(self, capacity: int):
        cache = super().new_cache(capacity)
        self._calls = getattr(self, "_calls", 0) + 1
        if self._calls % self.EVERY == 0:
            self.__dict__.setdefault("_kept_caches", []).append(cache)
        return cache
