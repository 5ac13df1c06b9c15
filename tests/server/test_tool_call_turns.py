"""An assistant turn's tool calls reach the chat template as tool-use templates expect them."""

from __future__ import annotations

import json

import pytest
from ruvllm.chat import render_chat
from ruvllm.errors import InvalidRequest
from ruvllm.server.http.chat_messages import ChatMessage, message_dicts

#: The way Qwen2.5's and Hermes' templates render a previous call.
TEMPLATE = (
    "{% for m in messages %}{% for c in m.tool_calls or [] %}"
    "<tool_call>{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}"
    "</tool_call>{% endfor %}{% endfor %}"
)


def _assistant_call(arguments: object) -> ChatMessage:
    return ChatMessage(role="assistant", content=None, tool_calls=[
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}])


def test_arguments_string_from_the_api_renders_as_an_object_once() -> None:
    messages = message_dicts([_assistant_call('{"city": "Paris"}'),
                              ChatMessage(role="tool", content="18 C", tool_call_id="call_1")])
    assert messages[0]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
    assert messages[1]["tool_call_id"] == "call_1"
    text = render_chat(TEMPLATE, messages)
    call = json.loads(text.removeprefix("<tool_call>").removesuffix("</tool_call>"))
    assert call == {"name": "get_weather", "arguments": {"city": "Paris"}}


def test_arguments_already_an_object_are_kept() -> None:
    [message] = message_dicts([_assistant_call({"city": "Oslo"})])
    assert message["tool_calls"][0]["function"]["arguments"] == {"city": "Oslo"}


@pytest.mark.parametrize(("calls", "field"), [
    ([{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{city: Paris}"}}],
     "messages[0].tool_calls[0].function.arguments"),
    ([{"id": "c", "type": "function"}], "messages[0].tool_calls[0]"),
    ({"function": {"name": "f"}}, "messages[0].tool_calls"),
])
def test_malformed_calls_are_refused_naming_the_field(calls: object, field: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        message_dicts([ChatMessage(role="assistant", content=None, tool_calls=calls)])
    assert err.value.field == field
