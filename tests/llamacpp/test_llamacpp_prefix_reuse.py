"""prefix_reuse keeps the previous call's KV; its output must equal a fresh call's."""

from __future__ import annotations

import pytest
from ruvllm import LLM
from ruvllm.types import GenerationParams

SYSTEM = [{"role": "system", "content": "You are a terse assistant. Answer in one sentence."}]
GREEDY = GenerationParams(max_tokens=16, ignore_eos=True)


@pytest.fixture(scope="module")
def reuse(test_options):
    with LLM(backend="llamacpp", options={**test_options, "prefix_reuse": True}) as instance:
        yield instance


def _chat(llm: LLM, question: str) -> list[int]:
    return llm.chat_prompt([*SYSTEM, {"role": "user", "content": question}])


PAIRS = [
    ("same prompt twice", lambda llm: (llm.encode("The sun is a"), llm.encode("The sun is a"))),
    ("extension", lambda llm: (llm.encode("The sun is a star"), llm.encode("The sun is a star that burns"))),
    ("shorter", lambda llm: (llm.encode("Rivers flow into the sea because"), llm.encode("Rivers flow"))),
    ("diverging", lambda llm: (llm.encode("My favourite fruit is the apple"),
                               llm.encode("My favourite fruit is the mango, since"))),
    ("unrelated", lambda llm: (llm.encode("Quantum computers use"), llm.encode("Bread is baked from"))),
    ("shared system prompt", lambda llm: (_chat(llm, "Why is the sky blue?"), _chat(llm, "What is rain?"))),
]


@pytest.mark.parametrize(("label", "make"), PAIRS, ids=[p[0] for p in PAIRS])
def test_reuse_is_token_identical_to_a_fresh_call(llm, reuse, label, make):
    first, second = make(reuse)
    produced = reuse.generate(first, GREEDY).token_ids
    # The KV holds the prompt and every produced token but the last (never evaluated).
    in_kv = [*first, *produced[:-1]]
    assert reuse.backend.cached_tokens() == len(in_kv)
    reused = reuse.generate(second, GREEDY)
    fresh = llm.generate(second, GREEDY)
    assert reused.token_ids == fresh.token_ids
    assert reused.text == fresh.text
    shared = next((i for i, (a, b) in enumerate(zip(in_kv, second, strict=False)) if a != b),
                  min(len(in_kv), len(second)))
    assert reuse.backend.last_reused_tokens == min(shared, len(second) - 1)


def test_continuing_a_conversation_reuses_its_history(llm, reuse):
    q1 = [*SYSTEM, {"role": "user", "content": "Name a planet."}]
    answer = reuse.chat(q1, max_tokens=16)
    q2 = [*q1, {"role": "assistant", "content": answer.text}, {"role": "user", "content": "And a moon?"}]
    again = reuse.chat(q2, max_tokens=16)
    assert reuse.backend.last_reused_tokens >= len(reuse.chat_prompt(q1))
    assert again.token_ids == llm.chat(q2, max_tokens=16).token_ids


def test_cached_state_stays_bounded(reuse):
    for prompt in ("alpha beta gamma", "delta epsilon", "zeta eta theta iota"):
        reuse.generate(prompt, max_tokens=8, ignore_eos=True)
        assert reuse.backend.cached_tokens() == len(reuse.encode(prompt)) + 8 - 1
