"""LangChain's ``ChatOpenAI`` against ``ruvllm serve`` on the embedded model, as its users write it.

The issue that filed this: ``bind_tools(...)`` answered 200 with plain text and no tool call,
because SmolLM2's chat template renders no tools. Here ``bind_tools`` gets real tool calls
(``reply_or_call`` teaching, guided/tools.py): 20 of 20 sampled answers are valid calls under
``tool_choice`` required, and each of 20 under auto is a valid call or a plain reply; an agent
loop runs a tool result back to a final answer, streamed tool-call chunks add up to the call,
and ``with_structured_output`` returns the schema's object by LangChain's schema methods.
"""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableParallel
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel, Field
from server_helpers import API_KEY


class WeatherArgs(BaseModel):
    # A bounded city: a sampled string may otherwise run on until max_tokens.
    city: str = Field(max_length=24, description="The city")


@tool(args_schema=WeatherArgs)
def get_weather(city: str) -> str:
    """Current weather in a city."""
    return f"It is sunny and 21 degrees in {city}."


QUESTIONS = ("What is the weather in Oslo?", "Is it raining in Paris right now?")


def _sampled(runnable, question, seeds: range) -> list:
    """One answer per seed, requested together (LangChain runs the branches in threads)."""
    branches = RunnableParallel({str(k): runnable.bind(seed=k) for k in seeds})
    return list(branches.invoke(question).values())


def assert_plain_reply(answer) -> None:
    """A reply: text, not JSON the server should have read (a call, or the reply_or_call
    envelope) passed through. The model's own words may hold a brace. One sampled reply opened
    with a brace and then echoed the instruction's placeholder in angle brackets: that is text,
    not JSON."""
    assert answer.content, answer
    try:
        parsed = json.loads(answer.content)
    except ValueError:
        return
    assert not isinstance(parsed, dict | list), answer


class Capital(BaseModel):
    """A country and its capital. The bounds are the schema's, so the server's grammar enforces
    them: a greedy answer once named the country and left the capital empty, which a schema
    without ``minLength`` admits."""

    country: str = Field(min_length=1, max_length=20)
    capital: str = Field(min_length=1, max_length=20)


@pytest.fixture(scope="module")
def llm(server, model_name) -> ChatOpenAI:
    return ChatOpenAI(base_url=server.base_url, api_key=API_KEY, model=model_name, temperature=0,
                      max_tokens=80, max_retries=0, timeout=60)


def test_bind_tools_gets_tool_calls_from_a_model_whose_template_renders_none(llm):
    answer = llm.bind_tools([get_weather], tool_choice="any").invoke("What is the weather in Oslo?")
    (call,) = answer.tool_calls
    assert call["name"] == "get_weather" and set(call["args"]) == {"city"}
    assert isinstance(call["args"]["city"], str) and call["args"]["city"]
    assert answer.response_metadata["finish_reason"] == "tool_calls"


def test_bind_tools_required_gives_a_valid_call_20_of_20(llm):
    bound = llm.bind_tools([get_weather], tool_choice="any").bind(temperature=0.8)
    answers = [a for q in QUESTIONS for a in _sampled(bound, q, range(10))]
    assert len(answers) == 20
    for answer in answers:
        (call,) = answer.tool_calls
        assert not answer.invalid_tool_calls and call["name"] == "get_weather"
        WeatherArgs.model_validate(call["args"], strict=True)
        assert set(call["args"]) == {"city"}


def test_bind_tools_auto_gives_a_call_or_a_reply_never_a_malformed_one(llm):
    """Sampled answers to the question (the model usually calls) and to the turn after the tool's
    result (it usually replies): each a valid call or a plain reply, 20 in all."""
    question = HumanMessage(QUESTIONS[0])
    call = {"name": "get_weather", "args": {"city": "Oslo"}, "id": "call_1", "type": "tool_call"}
    answered = [question, AIMessage("", tool_calls=[call]),
                ToolMessage(get_weather.invoke(call["args"]), tool_call_id="call_1")]
    bound = llm.bind_tools([get_weather]).bind(temperature=0.8)
    answers = _sampled(bound, [question], range(10)) + _sampled(bound, answered, range(10))
    for answer in answers:
        assert not answer.invalid_tool_calls, answer
        if answer.tool_calls:
            for c in answer.tool_calls:
                assert c["name"] == "get_weather"
                WeatherArgs.model_validate(c["args"], strict=True)
        else:
            assert_plain_reply(answer)


def test_an_agent_loop_runs_the_tool_and_answers_from_its_result(llm):
    question = HumanMessage("What is the weather in Oslo?")
    first = llm.bind_tools([get_weather], tool_choice="any").invoke([question])
    (call,) = first.tool_calls
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    final = llm.bind_tools([get_weather]).invoke([question, first, result])
    # Under auto the model chooses: a reply (text, never a call's JSON as text) or another call.
    if final.tool_calls:
        assert all(c["name"] == "get_weather" for c in final.tool_calls)
    else:
        assert_plain_reply(final)


def test_streamed_tool_call_chunks_add_up_to_the_call(llm):
    bound = llm.bind_tools([get_weather], tool_choice="any")
    whole = bound.invoke("What is the weather in Paris?")
    merged: AIMessageChunk | None = None
    for chunk in bound.stream("What is the weather in Paris?"):
        merged = chunk if merged is None else merged + chunk
    assert merged is not None
    calls = [(c["name"], c["args"]) for c in merged.tool_calls]
    assert calls and calls == [(c["name"], c["args"]) for c in whole.tool_calls]


# Not json_mode: it asks for any JSON object, which bounds neither keys nor length; a 135M model
# may write a long one (tests/guided covers json_object's grammar).
@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_structured_output_by_every_schema_method(llm, method):
    prompt = "Name a country and its capital."
    # Room for the longest object the schema admits: which answer the model writes depends on
    # the numerics (a cached prefix changes them on some CPUs), its shape does not.
    answer = llm.with_structured_output(Capital, method=method).bind(max_tokens=200).invoke(prompt)
    assert isinstance(answer, Capital) and answer.country and answer.capital
