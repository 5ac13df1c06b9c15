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


#: The model as its own draft (``speculative_model`` names it), fixed-length drafts: every draft
#: is verified, and nearly all are kept (only near-ties between two batch shapes differ).
SELF_DRAFT: dict[str, Any] = {"speculative_method": "draft_model", "num_speculative_tokens": 4,
                              "speculative_adaptive": False}


def generate(backend: LlmBackend, prompts: Sequence[str], params: GenerationParams, options: dict[str, Any],
             *, max_num_seqs: int = 4) -> tuple[list[GenerationResult], MetricsSnapshot]:
    """``prompts`` generated together on ``backend`` with the ``[engine]`` ``options``, and the
    engine's metrics; every KV block of the target, and of a draft model, free afterwards."""
    opts = EngineOptions(max_num_seqs=max_num_seqs, **options)
    with ServingEngine(backend, opts, owns_backend=False) as eng:
        results = eng.generate_sync(list(prompts), params)
        snapshot = eng.metrics()
        assert snapshot.kv_usage == 0.0, "a request's KV blocks were not released"
        draft = getattr(getattr(eng._core, "speculator", None), "draft", None)
        if draft is not None:
            held = eng.call(lambda: (draft.num_sequences, draft.blocks.num_used_blocks))
            assert held == (0, 0), f"the draft model still holds {held[0]} sequences, {held[1]} blocks"
    return results, snapshot


def with_and_without(backend: LlmBackend, prompts: Sequence[str], params: GenerationParams, *,
                     max_num_seqs: int = 4, speculative: dict[str, Any] | None = None,
                     options: dict[str, Any] | None = None,
                     ) -> tuple[list[GenerationResult], list[GenerationResult], MetricsSnapshot]:
    """``prompts`` generated together on ``backend`` without, then with ``speculative`` options
    (default :data:`FIXED_DRAFTS`), both with the ``[engine]`` ``options``; the speculative
    engine's metrics; every KV block free after each."""
    plain, _ = generate(backend, prompts, params, options or {}, max_num_seqs=max_num_seqs)
    spec, snapshot = generate(backend, prompts, params, {**(options or {}), **(speculative or FIXED_DRAFTS)},
                              max_num_seqs=max_num_seqs)
    return plain, spec, snapshot


def tokens_and_logprobs(results: Sequence[GenerationResult]) -> list[tuple]:
    """Each result's token ids and logprobs: what must be bit-identical where numerics are."""
    return [(r.token_ids, r.logprobs) for r in results]
