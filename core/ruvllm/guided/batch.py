"""Masks of all constrained rows of one engine step, computed together beside the forward pass.

Computing masks row by row after the forward pass would add ~30-50 us x rows to every step and
serialise them. Instead the executor core calls :func:`start_step_masks` just before
``BatchExecutor.execute``: every constrained row's matcher first takes the token it sampled last
step, then one background thread asks llguidance's ``LLExecutor`` to fill all the rows' masks
in parallel (the GIL is dropped), while the model runs. The samplers then wait on that work,
which has normally finished by the time the logits arrive.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from ruvllm.guided.processor import GuidedProcessor, mask_words

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_executor: Any = None
_lock = threading.Lock()


def _workers() -> tuple[concurrent.futures.ThreadPoolExecutor, Any]:
    global _pool, _executor
    with _lock:
        if _pool is None:
            import llguidance

            # One worker: the model's own threads already want every core; 16 rows of ~40 us fit
            # easily beside a forward pass, and extra spinning workers would slow the forward.
            _executor = llguidance.LLExecutor(num_threads=1)
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ruvllm-masks")
        return _pool, _executor


def guided_processors(samplers: Iterable[Any]) -> list[tuple[GuidedProcessor, Any]]:
    """``(processor, sampler)`` for every sampler of the step that has a grammar to enforce."""
    found = []
    for sampler in samplers:
        for proc in getattr(sampler, "processors", ()):
            if isinstance(proc, GuidedProcessor):
                found.append((proc, sampler))
    return found


def start_step_masks(samplers: Iterable[Any]) -> concurrent.futures.Future | None:
    """Start computing the masks of the constrained rows among ``samplers`` (the rows that will
    sample this step); None when there are none, at the cost of one scan of the samplers."""
    rows = guided_processors(samplers)
    if not rows:
        return None
    import llguidance.numpy as lln

    for proc, sampler in rows:
        proc.sync(sampler.output_ids)
    words = max(mask_words(proc.vocab_size) for proc, _ in rows)
    bitmask = np.full((len(rows), words), -1, dtype=np.int32)
    pool, executor = _workers()
    pairs = [(proc.matcher, i) for i, (proc, _) in enumerate(rows)]
    future = pool.submit(lln.fill_next_token_bitmask_par, executor, pairs, bitmask)
    for i, (proc, _) in enumerate(rows):
        proc.expect_mask(future, bitmask, i)
    return future
