"""Bad input: a typed error naming the field, and a backend that is unharmed afterwards.

Each test checks the backend's greedy output after the error against the output from before
it: a rejected request must leave no trace (the ancestor's server corrupted its engine state
on errors and answered later requests wrongly).
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from ruvllm.errors import ContextLengthExceeded, InvalidRequest, RuvllmError, UnknownBackend
from ruvllm.llm import LLM
from ruvllm.models import ModelSource
from ruvllm.testing.support import PROMPT_A, SHORT, describe
from ruvllm.types import GenerationParams, GenerationResult

#: Tokens of the health check after each rejected request (a corrupted state shows at once, in
#: the first tokens; the check runs after every one of some 25 rejected requests).
HEALTH_TOKENS = 4

#: (field, bad value) pairs; each must be rejected with InvalidRequest naming the field.
OUT_OF_RANGE: list[tuple[str, Any]] = [
    ("temperature", -1.0),
    ("temperature", 2.5),
    ("top_p", 0.0),
    ("top_p", 1.5),
    ("top_k", -1),
    ("min_p", 2.0),
    ("max_tokens", -1),
    ("max_tokens", -5),
    ("logprobs", 100),
    ("repetition_penalty", 0.0),
    ("frequency_penalty", 3.0),
    ("seed", -1),
    ("stop", [""]),
    ("stop_token_ids", [-1]),
]


@pytest.fixture(scope="session")
def reference(ruvllm_llm: LLM) -> GenerationResult:
    """PROMPT_A's greedy output before any bad request of this module."""
    return ruvllm_llm.generate(PROMPT_A, max_tokens=HEALTH_TOKENS)


def assert_still_healthy(llm: LLM, reference: GenerationResult) -> None:
    after = llm.generate(PROMPT_A, max_tokens=HEALTH_TOKENS)
    assert after.token_ids == reference.token_ids, (
        f"greedy output changed after a rejected request: {describe(reference)} -> {describe(after)}"
    )


class TestBadInput:
    @pytest.mark.parametrize("prompt", ["", []], ids=["empty-text", "empty-ids"])
    def test_empty_prompt(self, ruvllm_llm: LLM, reference: GenerationResult, prompt: Any) -> None:
        with pytest.raises(InvalidRequest) as err:
            ruvllm_llm.generate(prompt, max_tokens=SHORT)
        assert err.value.field == "prompt"
        assert_still_healthy(ruvllm_llm, reference)

    def test_prompt_longer_than_context(self, ruvllm_llm: LLM, reference: GenerationResult) -> None:
        """A prompt of context_length + 1 tokens: ContextLengthExceeded carrying the numbers."""
        llm = ruvllm_llm
        ctx = llm.info.context_length
        filler = llm.tokenizer.encode(" hello", add_special=False)[-1]
        ids = [filler] * (ctx + 1)
        with pytest.raises(ContextLengthExceeded) as err:
            llm.generate(ids, max_tokens=SHORT)
        e = err.value
        assert (e.prompt_tokens, e.max_tokens, e.context_length) == (ctx + 1, SHORT, ctx)
        assert str(ctx + 1) in str(e) and str(ctx) in str(e)
        assert e.field == "prompt"
        assert_still_healthy(llm, reference)

    def test_over_long_prompt_sent_to_the_backend_leaves_no_state(self, ruvllm_llm: LLM,
                                                                  reference: GenerationResult) -> None:
        """Core rejects a prompt that does not fit before any backend sees it (above), so a
        backend's own guard is only reached by a caller that drives the backend directly (an
        engine of its own, a test). Handed context_length + 1 tokens, the backend refuses (a
        ruvllm error, ideally ContextLengthExceeded) or returns without a token; either way the
        next request is unaffected. A guard that lets part of the prompt into the KV before it
        gives up must not leave that KV behind."""
        llm = ruvllm_llm
        ctx = llm.info.context_length
        filler = llm.tokenizer.encode(" hello", add_special=False)[-1]
        produced = []
        try:
            tokens = iter(llm.backend.generate([filler] * (ctx + 1), GenerationParams(max_tokens=1)))
            try:
                produced = list(itertools.islice(tokens, 1))
            finally:
                close = getattr(tokens, "close", None)
                if close is not None:
                    close()
        except RuvllmError:
            pass
        assert not produced, f"the backend generated {produced} from {ctx + 1} prompt tokens (context {ctx})"
        assert_still_healthy(llm, reference)

    def test_prompt_plus_max_tokens_over_context(self, ruvllm_llm: LLM,
                                                  reference: GenerationResult) -> None:
        """A prompt that fits but leaves no room for max_tokens is rejected up front."""
        llm = ruvllm_llm
        ctx = llm.info.context_length
        ids = llm.encode(PROMPT_A)
        with pytest.raises(ContextLengthExceeded) as err:
            llm.generate(ids, max_tokens=ctx)
        assert err.value.prompt_tokens == len(ids) and err.value.context_length == ctx
        assert_still_healthy(llm, reference)

    @pytest.mark.parametrize("where", ["prompt", "chat"])
    def test_lone_surrogate_in_text(self, ruvllm_llm: LLM, reference: GenerationResult, where: str) -> None:
        """A lone UTF-16 surrogate (legal in JSON, not Unicode) is a 400-class error naming the
        field, never a UnicodeEncodeError from the tokenizer underneath."""
        text = "ab \ud800 cd"
        with pytest.raises(InvalidRequest) as err:
            if where == "prompt":
                ruvllm_llm.generate(text, max_tokens=SHORT)
            else:
                ruvllm_llm.chat([{"role": "user", "content": text}], max_tokens=SHORT)
        assert err.value.field == ("prompt" if where == "prompt" else "messages[0].content")
        assert "surrogate" in str(err.value)
        assert_still_healthy(ruvllm_llm, reference)

    def test_token_id_outside_vocabulary(self, ruvllm_llm: LLM, reference: GenerationResult) -> None:
        llm = ruvllm_llm
        ids = [*llm.encode(PROMPT_A), llm.tokenizer.vocab_size]
        with pytest.raises(InvalidRequest) as err:
            llm.generate(ids, max_tokens=SHORT)
        assert err.value.field == "prompt"
        assert_still_healthy(llm, reference)

    @pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE,
                             ids=[f"{f}={v!r}" for f, v in OUT_OF_RANGE])
    def test_out_of_range_parameter(self, ruvllm_llm: LLM, field: str, value: Any) -> None:
        """InvalidRequest whose ``field`` (and message) names the offending parameter."""
        with pytest.raises(InvalidRequest) as err:
            ruvllm_llm.generate(PROMPT_A, **{"max_tokens": SHORT, field: value})
        assert err.value.field == field
        assert field in str(err.value)

    def test_out_of_range_parameters_leave_the_model_as_it_was(self, ruvllm_llm: LLM,
                                                               reference: GenerationResult) -> None:
        """Every refusal above, then one health check (one generation, not one per value: on the
        slowest backend each check costs seconds)."""
        for field, value in OUT_OF_RANGE:
            with pytest.raises(InvalidRequest):
                ruvllm_llm.generate(PROMPT_A, **{"max_tokens": SHORT, field: value})
        assert_still_healthy(ruvllm_llm, reference)

    def test_unknown_backend(self, ruvllm_llm: LLM, ruvllm_model_source: ModelSource,
                             reference: GenerationResult) -> None:
        """Asking for a backend nobody registered names it and lists the installed ones."""
        missing = "no-such-backend-" + ruvllm_llm.backend_name
        with pytest.raises(UnknownBackend) as err:
            LLM(ruvllm_model_source, backend=missing)
        assert err.value.name == missing
        assert ruvllm_llm.backend_name in err.value.known
        assert missing in str(err.value)
        assert_still_healthy(ruvllm_llm, reference)
