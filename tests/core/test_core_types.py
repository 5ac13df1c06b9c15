"""GenerationParams validation: bad values raise InvalidRequest naming the field and the range."""

from __future__ import annotations

import math

import pytest
from ruvllm.errors import ContextLengthExceeded, InvalidRequest, RuvllmError
from ruvllm.types import (
    MAX_LOGPROBS,
    FinishReason,
    GenerationParams,
    GenerationResult,
    Timings,
    Usage,
)


@pytest.mark.parametrize(
    ("field", "value", "expected_in_message"),
    [
        ("max_tokens", -1, ">= 0"),
        ("max_tokens", 2.5, "integer"),
        ("max_tokens", True, "integer"),
        ("temperature", -0.1, "[0.0, 2.0]"),
        ("temperature", 2.01, "[0.0, 2.0]"),
        ("temperature", math.nan, "NaN"),
        ("temperature", "hot", "number"),
        ("top_p", 0.0, "(0.0, 1.0]"),
        ("top_p", 1.5, "(0.0, 1.0]"),
        ("top_p", math.nan, "NaN"),
        ("top_k", -1, ">= 0"),
        ("min_p", 1.1, "[0.0, 1.0]"),
        ("repetition_penalty", 0.0, "(0.0, 2.0]"),
        ("repetition_penalty", 2.5, "(0.0, 2.0]"),
        ("frequency_penalty", -2.5, "[-2.0, 2.0]"),
        ("presence_penalty", 3, "[-2.0, 2.0]"),
        ("seed", -1, ">= 0"),
        ("seed", 1.0, "integer"),
        ("logprobs", -1, f"[0, {MAX_LOGPROBS}]"),
        ("logprobs", MAX_LOGPROBS + 1, f"[0, {MAX_LOGPROBS}]"),
        ("logprobs", 2.5, "integer"),
    ],
)
def test_out_of_range_value_names_field_and_range(field, value, expected_in_message):
    with pytest.raises(InvalidRequest) as info:
        GenerationParams(**{field: value})
    err = info.value
    assert err.field == field
    assert expected_in_message in str(err)
    assert str(err).startswith(f"{field}: ")
    assert err.http_status == 400


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", 0.0), ("temperature", 2.0), ("temperature", 1),
        ("top_p", 1.0), ("top_p", 1e-6), ("min_p", 0.0), ("min_p", 1.0),
        ("repetition_penalty", 2.0), ("frequency_penalty", -2.0), ("presence_penalty", 2.0),
        ("logprobs", 0), ("logprobs", MAX_LOGPROBS), ("seed", 0), ("top_k", 0),
        ("max_tokens", 0), ("max_tokens", 1),
    ],
)
def test_boundary_values_are_accepted(field, value):
    assert getattr(GenerationParams(**{field: value}), field) == value


def test_stop_accepts_a_string_or_a_list():
    assert GenerationParams(stop="###").stop == ("###",)
    assert GenerationParams(stop=["a", "bc"]).stop == ("a", "bc")
    assert GenerationParams(stop=None).stop == ()
    assert GenerationParams().stop == ()


@pytest.mark.parametrize("bad", [[""], ["ok", 3], 5, {"a": 1}])
def test_bad_stop_names_the_stop_field(bad):
    with pytest.raises(InvalidRequest) as info:
        GenerationParams(stop=bad)
    assert info.value.field == "stop"


@pytest.mark.parametrize("bad", [[-1], [True], ["3"], 7])
def test_bad_stop_token_ids_name_their_field(bad):
    with pytest.raises(InvalidRequest) as info:
        GenerationParams(stop_token_ids=bad)
    assert info.value.field == "stop_token_ids"


def test_stop_token_ids_become_a_tuple():
    assert GenerationParams(stop_token_ids=[5, 9]).stop_token_ids == (5, 9)


def test_greedy_and_penalty_flags():
    assert GenerationParams().greedy
    assert not GenerationParams(temperature=0.7).greedy
    assert not GenerationParams().has_penalties
    assert GenerationParams(repetition_penalty=1.1).has_penalties
    assert GenerationParams(frequency_penalty=0.5).has_penalties
    assert GenerationParams(presence_penalty=-0.5).has_penalties


def test_params_are_frozen_values():
    p = GenerationParams(max_tokens=5)
    with pytest.raises(AttributeError):
        p.max_tokens = 6  # type: ignore[misc]
    assert p == GenerationParams(max_tokens=5)


def test_context_length_exceeded_carries_the_numbers():
    err = ContextLengthExceeded(prompt_tokens=100, max_tokens=50, context_length=120)
    assert isinstance(err, InvalidRequest) and isinstance(err, RuvllmError)
    assert (err.prompt_tokens, err.max_tokens, err.context_length) == (100, 50, 120)
    assert err.field == "prompt"
    assert "at most 20" in str(err)


@pytest.mark.parametrize("prompt_tokens", [120, 150])
def test_a_prompt_that_fills_the_window_alone_is_told_to_shrink_by_how_much(prompt_tokens):
    """Lowering max_tokens cannot help a prompt of the whole window or more: the fix the error
    names is the prompt's, with the tokens to cut (one new token must still fit)."""
    message = str(ContextLengthExceeded(prompt_tokens=prompt_tokens, max_tokens=16, context_length=120))
    assert "max_tokens to at most" not in message
    assert f"shorten the prompt by at least {prompt_tokens - 119} tokens" in message


def test_result_rates_and_totals():
    r = GenerationResult(
        text="x", token_ids=(1, 2, 3), finish_reason=FinishReason.LENGTH,
        usage=Usage(prompt_tokens=4, completion_tokens=3),
        timings=Timings(queue=0.5, prefill=0.25, decode=0.5),
    )
    assert r.usage.total_tokens == 7
    assert r.timings.total == pytest.approx(1.25)
    assert r.decode_tokens_per_second == pytest.approx(4.0)  # 2 tokens after the first in 0.5 s
    assert FinishReason.STOP.value == "stop" and FinishReason.LENGTH == "length"
