"""Masks of all constrained rows of one engine step, computed together beside the forward pass.

Computing masks row by row after the forward pass would add ~30-50 us x rows to every step and
serialise them. Instead the executor core calls :func:`start_step_masks` just before
``BatchExecutor.execute``: every constrained row's matcher first takes the token it sampled last
step, then one background thread asks each grammar engine present in the step to fill all of
its rows' masks in one call (llguidance's ``LLExecutor``, xgrammar's ``BatchGrammarMatcher``;
both drop the GIL), into one shared bitmask, while the model runs. The samplers then wait on
that work, which has normally finished by the time the logits arrive.
"""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterable
from typing import Any

import numpy as np

from ruvllm.guided.engine import GrammarEngine, GuidedMatcher
from ruvllm.guided.fork_guard import library_call
from ruvllm.guided.processor import GuidedProcessor, mask_words

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_lock = threading.Lock()

#: One engine's share of a step: its matchers and the bitmask rows they fill.
Group = tuple[GrammarEngine, list[GuidedMatcher], list[int]]


def _worker() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            # One worker: the model's own threads already want every core.
            _pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="ruvllm-masks")
        return _pool


def guided_processors(samplers: Iterable[Any]) -> list[tuple[GuidedProcessor, Any]]:
    """``(processor, sampler)`` for every sampler of the step that has a grammar to enforce."""
    found = []
    for sampler in samplers:
        for proc in getattr(sampler, "processors", ()):
            if isinstance(proc, GuidedProcessor):
                found.append((proc, sampler))
    return found


def _fill(groups: list[Group], bitmask: np.ndarray) -> None:
    for engine, matchers, rows in groups:
        with library_call():
            engine.fill_masks(matchers, bitmask, rows)


def start_step_masks(samplers: Iterable[Any]) -> concurrent.futures.Future | None:
    """Start computing the masks of the constrained rows among ``samplers`` (the rows that will
    sample this step); None when there are none, at the cost of one scan of the samplers."""
    rows = guided_processors(samplers)
    if not rows:
        return None
    by_engine: dict[str, Group] = {}
    for i, (proc, sampler) in enumerate(rows):
        proc.sync(sampler.output_ids)
        group = by_engine.setdefault(proc.engine.name, (proc.engine, [], []))
        group[1].append(proc.matcher)
        group[2].append(i)
    words = max(mask_words(proc.vocab_size) for proc, _ in rows)
    bitmask = np.full((len(rows), words), -1, dtype=np.int32)
    future = _worker().submit(_fill, list(by_engine.values()), bitmask)
    for i, (proc, _) in enumerate(rows):
        proc.expect_mask(future, bitmask, i)
    return future
