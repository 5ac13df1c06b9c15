"""Tools on a model whose chat template renders none: the embedded SmolLM2, through ``openai``.

The server teaches such a model the tools in a system message and constrains an ``auto``
answer to one JSON object, a reply or calls (``reply_or_call``, guided/tools.py); enforced
calls keep their grammar. What must hold is what a client relies on: a valid call (arguments
that validate against the tool's schema, no invented keys) or a plain reply, never JSON text
presented as content, and a stream that adds up to the whole answer.
"""

from __future__ import annotations

import json

import httpx
import jsonschema
import openai
import pytest
from ruvllm.chat import render_chat
from ruvllm.guided.tools import plan_tools, taught_conversation
from server_helpers import API_KEY

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    # A bounded city: a sampled string may otherwise run on until max_tokens (measured once in 20).
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24}},
                   "required": ["city"]}}}
#: The tool's schema as the server enforces it: no property it does not name.
ARGUMENTS = {**WEATHER["function"]["parameters"], "additionalProperties": False}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
#: The next turn: the call was made and answered, so a reply is what the model usually writes.
CALL = {"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
ANSWERED = [*ASK, {"role": "assistant", "content": None, "tool_calls": [CALL]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]


def _valid_call(call) -> None:
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), ARGUMENTS)


def _call_or_reply(choice) -> str:
    """``call`` or ``reply``; fails on anything else (JSON text as content, a broken call)."""
    message = choice.message
    if message.tool_calls:
        assert choice.finish_reason == "tool_calls" and message.content is None, choice
        assert len(message.tool_calls) == 1  # one call per answer unless parallel_tool_calls
        _valid_call(message.tool_calls[0])
        return "call"
    assert choice.finish_reason in ("stop", "length"), choice
    assert not message.content.lstrip().startswith("{"), f"JSON text given as content: {message.content!r}"
    return "reply"


def test_models_say_which_tool_format_a_model_gets(client, model_name):
    card = client.models.retrieve(model_name)
    assert card.model_extra["tool_format"] == "reply_or_call"


def test_required_gives_a_valid_call_every_time(client, model_name):
    """20 sampled answers (two questions, ten seeded choices each), all valid calls."""
    calls = 0
    for question in ("What is the weather in Oslo?", "Is it raining in Paris right now?"):
        r = client.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": question}], tools=[WEATHER],
            tool_choice="required", temperature=0.8, seed=7, n=10, max_tokens=60)
        for choice in r.choices:
            assert choice.finish_reason == "tool_calls", choice
            assert len(choice.message.tool_calls) == 1
            _valid_call(choice.message.tool_calls[0])
            calls += 1
    assert calls == 20


def test_auto_answers_with_a_call_or_a_reply(client, model_name):
    """Sampled answers to a question (the model calls the tool) and to the turn after the tool's
    result (it replies): each one a valid call or a plain reply."""
    kinds = []
    for messages in (ASK, ANSWERED):
        r = client.chat.completions.create(model=model_name, messages=messages, tools=[WEATHER],
                                           temperature=0.8, seed=3, n=4, max_tokens=48)
        kinds.append([_call_or_reply(c) for c in r.choices])
    greedy = [client.chat.completions.create(model=model_name, messages=m, tools=[WEATHER], temperature=0,
                                             max_tokens=48).choices[0] for m in (ASK, ANSWERED)]
    assert [_call_or_reply(c) for c in greedy] == ["call", "reply"], (greedy, kinds)
    assert json.loads(greedy[0].message.tool_calls[0].function.arguments) == {"city": "Oslo"}


@pytest.mark.parametrize("messages", [ASK, ANSWERED], ids=["call", "reply"])
def test_a_stream_adds_up_to_the_whole_answer(client, model_name, messages):
    body = dict(model=model_name, messages=messages, tools=[WEATHER], temperature=0, max_tokens=48)
    whole = client.chat.completions.create(**body).choices[0]
    content, calls, finish = "", [], None
    for chunk in client.chat.completions.create(stream=True, **body):
        for c in chunk.choices:
            content += c.delta.content or ""
            calls += c.delta.tool_calls or []
            finish = c.finish_reason or finish
    assert finish == whole.finish_reason
    assert content == (whole.message.content or "")
    assert [(c.function.name, json.loads(c.function.arguments)) for c in calls] == \
        [(c.function.name, json.loads(c.function.arguments)) for c in whole.message.tool_calls or []]


def test_the_prompt_teaches_the_tools_and_the_earlier_turns(server, client, model_name):
    """The tokens the server ran are the template's rendering of the taught conversation: the
    tools and the format in the system message, the earlier call as the JSON the model answers
    in, the tool's result as a user turn."""
    engine = server.engine
    r = client.chat.completions.create(model=model_name, messages=ANSWERED, tools=[WEATHER], temperature=0,
                                       max_tokens=1)
    plan = plan_tools([WEATHER], "auto", None, engine.info.chat_template)
    as_template = [ASK[0], {"role": "assistant", "content": "", "tool_calls": [
        {**CALL, "function": {"name": "get_weather", "arguments": {"city": "Oslo"}}}]}, ANSWERED[2]]
    taught = taught_conversation(as_template, plan)
    st = engine.info.special_tokens
    text = render_chat(engine.info.chat_template, taught, bos_token=st.bos_text, eos_token=st.eos_text)
    assert '"name": "get_weather"' in text and "Result of tool call call_1: sunny, 21 C" in text
    assert '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}' in text
    assert r.usage.prompt_tokens == len(engine.encode(text, add_special=False, parse_special=True))


def test_tools_and_another_output_constraint_are_refused_together(client, model_name):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=model_name, messages=ASK, tools=[WEATHER], max_tokens=8,
                                       response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format"


def test_tokenize_counts_a_chat_request_with_tools(server, client, model_name):
    """vLLM's ``/tokenize`` takes the chat request's tools: its count is that request's prompt."""
    def count(**body) -> int:
        answer = httpx.post(server.url + "/tokenize", json={"messages": ASK, **body},
                            headers={"Authorization": f"Bearer {API_KEY}"})
        assert answer.status_code == 200, answer.text
        return answer.json()["count"]

    chat = client.chat.completions.create(model=model_name, messages=ASK, tools=[WEATHER], max_tokens=1)
    assert chat.usage.prompt_tokens == count(tools=[WEATHER]) > count()
