"""Speculative decoding's per-request counts reach OpenAI clients in ``usage`` (extension
fields ``draft_tokens`` and ``accepted_draft_tokens``), streamed and not, through the official
``openai`` client against a real server speculating with prompt lookup on llama.cpp."""

from __future__ import annotations

import openai
import pytest
from ruvllm.server.openai.formatters import usage
from ruvllm.testing.speculative import COPY_PROMPT, FIXED_DRAFTS
from ruvllm.types import FinishReason, GenerationResult, Timings, Usage
from server_helpers import API_KEY, start_server


@pytest.fixture(scope="module")
def client():
    running = start_server(engine_options={**FIXED_DRAFTS, "max_num_seqs": 2},
                           server={"max_tokens_limit": 64})
    yield openai.OpenAI(base_url=running.base_url, api_key=API_KEY, max_retries=0, timeout=60)
    running.stop()


def drafts(usage) -> tuple[int, int]:
    extra = usage.model_extra or {}
    return extra.get("draft_tokens", 0), extra.get("accepted_draft_tokens", 0)


def test_usage_carries_draft_counts_streamed_and_not(client):
    model = client.models.list().data[0].id
    ask = {"model": model, "max_tokens": 24, "temperature": 0.0}
    whole = client.completions.create(prompt=COPY_PROMPT, **ask)
    drafted, accepted = drafts(whole.usage)
    assert drafted >= accepted > 8, whole.usage  # the copy prompt is mostly drafted and kept
    assert accepted <= whole.usage.completion_tokens

    stream = client.chat.completions.create(messages=[{"role": "user", "content": COPY_PROMPT}],
                                            stream=True, stream_options={"include_usage": True}, **ask)
    chunks = list(stream)
    final = chunks[-1].usage
    assert final is not None and not chunks[-1].choices
    drafted, accepted = drafts(final)
    assert drafted >= accepted >= 0 and drafted > 0, final


def test_usage_has_no_draft_fields_without_drafts():
    result = GenerationResult(token_ids=(5, 6), text="ab", finish_reason=FinishReason.LENGTH,
                              usage=Usage(prompt_tokens=3, completion_tokens=2), timings=Timings())
    assert usage(3, 2, [result]) == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                                     "prompt_tokens_details": {"cached_tokens": 0}}
