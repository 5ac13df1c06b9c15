"""OpenAI's usage from the engine's results: cached prompt tokens are counted as prompt tokens are."""

from __future__ import annotations

from ruvllm.server.openai.formatters import cached_tokens, usage
from ruvllm.types import FinishReason, GenerationResult, Timings, Usage


def _result(prompt: int, cached: int) -> GenerationResult:
    counts = Usage(prompt_tokens=prompt, completion_tokens=1, cached_prompt_tokens=cached)
    return GenerationResult(text="a", token_ids=(5,), finish_reason=FinishReason.LENGTH, timings=Timings(),
                            usage=counts)


def test_cached_tokens_count_each_prompt_once_for_what_none_of_its_choices_computed():
    # Two prompts, two choices each, in choice order: the first prompt's choices read 32 and 48
    # tokens from the cache (16 of them computed by one of them), the second's none.
    results = [_result(60, 32), _result(60, 48), _result(20, 0), _result(20, 0)]
    assert cached_tokens(results, prompts=2) == 32
    assert cached_tokens(results[:2], prompts=1) == 32
    assert cached_tokens([_result(60, 32), _result(20, 16)], prompts=2) == 48  # n=1: each its own
    assert cached_tokens([], prompts=1) == 0
    assert usage(80, 4, results, prompts=2)["prompt_tokens_details"] == {"cached_tokens": 32}
