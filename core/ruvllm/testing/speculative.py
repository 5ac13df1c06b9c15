"""Running the same requests with and without speculative decoding, for backends' tests.

Speculation must not change what a request generates; the tests of each executor backend
compare the two runs on a prompt whose answer copies its input, so prompt lookup drafts often
and is sometimes wrong (rejected drafts, whose KV must be released).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ruvllm.backend import LlmBackend
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.serving import MetricsSnapshot
from ruvllm.types import GenerationParams, GenerationResult

TEXT = ("The river bends twice before it reaches the old stone bridge near the market. Engineers "
        "measured the load on each beam and wrote the numbers down.")
#: A prompt whose continuation copies the text: most drafts are kept, some are not.
COPY_PROMPT = f"Repeat the text exactly.\n\nText: {TEXT}\n\nRepeated: The river bends"
#: Fixed-length drafts whenever a request's tail matches, so rejections happen on free text too.
FIXED_DRAFTS: dict[str, Any] = {"speculative_method": "ngram", "num_speculative_tokens": 6,
                                "prompt_lookup_min": 1, "prompt_lookup_max": 3, "speculative_adaptive": False}


def with_and_without(backend: LlmBackend, prompts: Sequence[str], params: GenerationParams, *,
                     max_num_seqs: int = 4) -> tuple[list[GenerationResult], list[GenerationResult],
                                                     MetricsSnapshot]:
    """``prompts`` generated together on ``backend`` without, then with :data:`FIXED_DRAFTS`
    speculation; the speculative engine's metrics; every KV block free after each."""
    runs = []
    for options in ({}, FIXED_DRAFTS):
        with ServingEngine(backend, EngineOptions(max_num_seqs=max_num_seqs, **options),
                           owns_backend=False) as eng:
            runs.append(eng.generate_sync(list(prompts), params))
            snapshot = eng.metrics()
            assert snapshot.kv_usage == 0.0, "a request's KV blocks were not released"
    return runs[0], runs[1], snapshot
