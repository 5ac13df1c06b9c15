"""OpenAI's deprecated functions API (``functions``, ``function_call``, ``function`` messages),
through the official ``openai`` client: the same tools machinery, one call an answer, answered
as ``message.function_call`` with ``finish_reason: "function_call"``, as older clients expect."""

from __future__ import annotations

import json

import httpx
import openai
import pytest
from server_helpers import API_KEY

WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
NAMED = {"name": "get_weather"}


def test_a_function_call_is_the_tool_call_in_the_old_shape(client, model_name):
    ask = dict(model=model_name, messages=ASK, max_tokens=40, temperature=0)
    old = client.chat.completions.create(**ask, functions=[WEATHER], function_call=NAMED).choices[0]
    new = client.chat.completions.create(**ask, tools=[{"type": "function", "function": WEATHER}],
                                         tool_choice={"type": "function", "function": NAMED}).choices[0]
    assert old.finish_reason == "function_call" and old.message.tool_calls is None
    assert old.message.function_call.name == "get_weather"
    assert "city" in json.loads(old.message.function_call.arguments)
    assert old.message.function_call.arguments == new.message.tool_calls[0].function.arguments

    stream = client.chat.completions.create(**ask, functions=[WEATHER], function_call=NAMED, stream=True)
    deltas = [c.choices[0] for c in stream if c.choices]
    calls = [d.delta.function_call for d in deltas if d.delta.function_call]
    assert [c.name for c in calls] == ["get_weather"]
    assert calls[0].arguments == old.message.function_call.arguments
    assert deltas[-1].finish_reason == "function_call"


def test_function_turns_render_as_the_tool_turns_they_stand_for(server):
    """An assistant's ``function_call`` and the ``function`` message answering it give the prompt
    of the same call and answer as ``tool_calls`` and a ``tool`` message."""
    call = {"name": "get_weather", "arguments": '{"city": "Oslo"}'}
    old = [*ASK, {"role": "assistant", "content": None, "function_call": call},
           {"role": "function", "name": "get_weather", "content": "sunny, 21 C"}]
    new = [*ASK, {"role": "assistant", "content": None,
                  "tool_calls": [{"id": "call_1", "type": "function", "function": call}]},
           {"role": "tool", "name": "get_weather", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    tools = [{"type": "function", "function": WEATHER}]

    def tokens(messages):
        r = httpx.post(server.url + "/tokenize", json={"messages": messages, "tools": tools},
                       headers={"Authorization": f"Bearer {API_KEY}"})
        assert r.status_code == 200, r.text
        return r.json()["tokens"]

    assert tokens(old) == tokens(new)


@pytest.mark.parametrize("extra, param, why", [
    ({"functions": [WEATHER], "tools": [{"type": "function", "function": WEATHER}]}, "functions", "not both"),
    ({"function_call": NAMED}, "function_call", "needs functions"),
    ({"functions": [WEATHER], "messages": [*ASK, {"role": "function", "content": "sunny"}]},
     "messages[1].name", "answers the assistant's function_call"),
])
def test_a_mixed_or_incomplete_functions_request_is_a_400_naming_it(client, model_name, extra, param, why):
    body = {"messages": ASK, **extra}
    with pytest.raises(openai.BadRequestError, match=why) as err:
        client.chat.completions.create(model=model_name, max_tokens=4, **body)
    assert err.value.body["param"] == param, err.value.body
