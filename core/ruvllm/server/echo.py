"""``echo`` on ``/v1/completions``: the prompt's own logprobs merged in front of the choice's.

OpenAI (and vLLM) answer ``echo: true`` with ``logprobs: n`` by listing the prompt tokens first
in ``logprobs``: ``token_logprobs[0]`` and ``top_logprobs[0]`` are ``null`` (nothing precedes
the first token), and ``text_offset`` counts from the start of the echoed prompt. This is the
shape lm-evaluation-harness's ``local-completions`` model reads loglikelihoods from.
``max_tokens: 0`` asks for the prompt alone: the engine still samples one token (it has to run
the prompt's last position anyway), and that token is left out of the answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ruvllm.tokenizer import Tokenizer
from ruvllm.types import GenerationResult, PromptLogprob


def prompt_logprob_lists(prompt_ids: Sequence[int], entries: Sequence[PromptLogprob | None],
                         tokenizer: Tokenizer, top_n: int) -> dict[str, list[Any]]:
    """The legacy ``logprobs`` lists of the prompt (offsets from 0)."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = 0
    for tid, entry in zip(prompt_ids, entries, strict=True):
        text = tokenizer.token_text(tid)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            token_lps.append(None)
            tops.append(None)
        else:
            token_lps.append(entry.logprob)
            tops.append({t.text: t.logprob for t in entry.top_logprobs[:top_n]} if top_n else None)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def merge_echo(response: dict[str, Any], results: Sequence[GenerationResult],
               prompts: Sequence[Sequence[int]], echoes: Sequence[str], tokenizer: Tokenizer, *,
               top_n: int | None, echo_only: bool) -> dict[str, Any]:
    """Complete a ``text_completion`` built with ``echo``: prepend each choice's prompt logprobs
    (``top_n`` not None) and, with ``echo_only`` (``max_tokens: 0``), drop the generated token.

    ``results[i]``, ``prompts[i]`` and ``echoes[i]`` belong to ``response["choices"][i]``.
    """
    for choice, result, ids, echo in zip(response["choices"], results, prompts, echoes, strict=True):
        generated = choice["logprobs"]
        if echo_only:
            choice["text"] = echo
            choice["finish_reason"] = "length"
        if top_n is None:
            continue
        assert result.prompt_logprobs is not None, "prompt logprobs were asked of the engine"
        merged = prompt_logprob_lists(ids, result.prompt_logprobs, tokenizer, top_n)
        if generated is not None and not echo_only:
            for key in merged:
                merged[key].extend(generated[key])
        choice["logprobs"] = merged
    if echo_only:
        usage = response["usage"]
        usage["completion_tokens"] = 0
        usage["total_tokens"] = usage["prompt_tokens"]
    return response
