"""Anthropic's Messages API through the official ``anthropic`` client, on the embedded model.

The surface is thin (server/anthropic/messages_api.py): what it must show is that a client written for
Anthropic gets the same answers as an OpenAI client does from the same core, in Anthropic's
shapes: the same greedy text as ``/v1/chat/completions`` for the same conversation, a stream of
Anthropic's events that adds up to the whole message, ``tool_use`` / ``tool_result`` round
trips, stop sequences, token counts, and errors in Anthropic's shape.
"""

from __future__ import annotations

import json

import anthropic
import jsonschema
import pytest
from server_helpers import API_KEY

GREEDY = {"temperature": 0}  # the current SDK no longer types temperature; older clients send it
WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]
CONVERSATION = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": [{"type": "text", "text": "And another one?"}]},
]


def _greedy(model: str, question: str, max_tokens: int) -> dict:
    return {"model": model, "max_tokens": max_tokens, "messages": [{"role": "user", "content": question}],
            "extra_body": GREEDY}


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)


def test_the_same_conversation_gives_the_same_answer_as_chat(claude, client, model_name):
    message = claude.messages.create(
        model=model_name, max_tokens=24, system="Be brief.", messages=CONVERSATION, extra_body=GREEDY
    )
    chat = client.chat.completions.create(
        model=model_name,
        max_tokens=24,
        temperature=0,
        messages=[
            {"role": "system", "content": "Be brief."},
            *CONVERSATION[:2],
            {"role": "user", "content": "And another one?"},
        ],
    )
    assert message.type == "message" and message.role == "assistant" and message.model == model_name
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == chat.choices[0].message.content
    assert message.stop_reason == {"stop": "end_turn", "length": "max_tokens"}[chat.choices[0].finish_reason]
    # Anthropic counts the tokens read from the prefix cache apart from input_tokens.
    usage = message.usage
    assert usage.cache_creation_input_tokens == 0
    assert usage.input_tokens + usage.cache_read_input_tokens == chat.usage.prompt_tokens
    assert usage.output_tokens == chat.usage.completion_tokens
    counted = claude.messages.count_tokens(model=model_name, system="Be brief.", messages=CONVERSATION)
    assert counted.input_tokens == usage.input_tokens + usage.cache_read_input_tokens


def test_a_stream_is_anthropics_events_and_adds_up_to_the_message(claude, model_name):
    body = _greedy(model_name, "Count to five.", 20)
    whole = claude.messages.create(**body)
    with claude.messages.stream(**body) as stream:
        events = [event.type for event in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start" and events[-1] == "message_stop"
    assert "content_block_start" in events and "message_delta" in events
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in whole.content]
    assert (final.stop_reason, final.usage.output_tokens) == (whole.stop_reason, whole.usage.output_tokens)
    # The stream's closing counts hold the cache hit the start could not know: same prompt as whole's.
    assert final.usage.cache_read_input_tokens > 0
    assert final.usage.input_tokens + final.usage.cache_read_input_tokens == \
        whole.usage.input_tokens + whole.usage.cache_read_input_tokens


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_use_round_trip(claude, model_name, stream):
    """The model calls the tool (a tool_use block whose input validates), and answers the
    tool's result in text."""
    body = dict(model=model_name, max_tokens=60, tools=[WEATHER], messages=ASK, extra_body=GREEDY)
    if stream:
        with claude.messages.stream(**body) as events:
            message = events.get_final_message()
    else:
        message = claude.messages.create(**body)
    assert message.stop_reason == "tool_use"
    (use,) = [b for b in message.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.id.startswith("toolu_")
    jsonschema.validate(use.input, {**WEATHER["input_schema"], "additionalProperties": False})
    reply = claude.messages.create(
        model=model_name,
        max_tokens=40,
        tools=[WEATHER],
        extra_body=GREEDY,
        messages=[
            *ASK,
            {"role": "assistant", "content": message.content},
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "sunny, 21 C"}],
            },
        ],
    )
    assert reply.stop_reason in ("end_turn", "max_tokens") and [b.type for b in reply.content] == ["text"]
    assert reply.content[0].text


def test_tool_choice_any_always_calls(claude, model_name):
    # Sampled (no seed in Anthropic's API): the city is bounded and max_tokens leaves room for the
    # longest call, else a long sampled string ends at max_tokens (seen once in CI at 40 tokens).
    bounded = {**WEATHER, "input_schema": {**WEATHER["input_schema"], "properties": {
        "city": {"type": "string", "maxLength": 24}}}}
    message = claude.messages.create(
        model=model_name,
        max_tokens=80,
        tools=[bounded],
        messages=[{"role": "user", "content": "Tell me a joke."}],
        tool_choice={"type": "any"},
        extra_body={"temperature": 0.8},
    )
    assert message.stop_reason == "tool_use" and [b.type for b in message.content] == ["tool_use"]


def test_a_stop_sequence_ends_the_message_and_is_named(claude, model_name):
    body = _greedy(model_name, "Count: one two three", 30)
    free = claude.messages.create(**body).content[0].text
    words = free.split()
    assert len(words) >= 2, free
    stop = words[1]
    cut = claude.messages.create(**body, stop_sequences=[stop])
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == free[: free.index(stop)]


def test_structured_output_follows_the_schema(claude, model_name):
    schema = {
        "type": "object",
        "properties": {"colour": {"enum": ["red", "green", "blue"]}},
        "required": ["colour"],
    }
    message = claude.messages.create(
        model=model_name,
        max_tokens=30,
        messages=[{"role": "user", "content": "Pick a colour."}],
        output_config={"format": {"type": "json_schema", "schema": schema}},
    )
    jsonschema.validate(json.loads(message.content[0].text), schema)


def test_errors_come_in_anthropics_shape(claude, server, model_name):
    def refused(**body) -> dict:
        with pytest.raises(anthropic.BadRequestError) as err:
            claude.messages.create(model=model_name, **body)
        assert (
            err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
        )
        return err.value.body["error"]

    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AA=="}}
    assert refused(max_tokens=8, messages=[{"role": "user", "content": [image]}])["message"].startswith(
        "messages[0].content[0]"
    )
    assert refused(max_tokens=8, messages=ASK, extra_body={"temperature": 1.5})["message"].startswith(
        "temperature"
    )
    assert refused(max_tokens=8, messages=ASK, thinking={"type": "enabled", "budget_tokens": 1024})[
        "message"
    ].startswith("thinking.type")
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=model_name, max_tokens=0, messages=ASK)
    # A block that is not an object, or whose type is one (once a 500, issue 62), on both routes.
    for content, field in (([[None, None]], "messages[0].content[0]"),
                           ([{"type": {}, "text": "Hi"}], "messages[0].content[0].type")):
        messages = [{"role": "user", "content": content}]
        assert refused(max_tokens=8, messages=messages)["message"].startswith(f"{field}: must be ")
        with pytest.raises(anthropic.BadRequestError) as err:
            claude.messages.count_tokens(model=model_name, messages=messages)
        assert err.value.body["error"]["message"].startswith(f"{field}: must be "), err.value.body
    with pytest.raises(anthropic.NotFoundError) as err:
        claude.messages.create(model="no-such-model", max_tokens=8, messages=ASK)
    assert err.value.body["error"]["type"] == "not_found_error"
    wrong = anthropic.Anthropic(base_url=server.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as err:
        wrong.messages.create(model=model_name, max_tokens=8, messages=ASK)
    assert err.value.body["error"]["type"] == "authentication_error"


_NAMED = {"name": "f", "input_schema": {"type": "object"}}


@pytest.mark.parametrize(("body", "field"), [
    ({"tools": [WEATHER, {**_NAMED, "name": "get weather"}]}, "tools[1].name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].name"),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "get_time"}}, "tool_choice.name"),
    ({"output_config": {"format": {"type": "json_schema", "schema": {"type": "frob"}}}},
     "output_config.format.schema"),
    ({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                   {"role": "user", "content": "word " * 12_000}]}, "messages"),
], ids=lambda v: v if isinstance(v, str) else None)
@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_refusals_of_the_shared_chat_path_name_the_field_sent(claude, model_name, body, field, stream):
    """The chat request every surface runs names its own fields (``tools[1].function.name``,
    ``response_format.json_schema.schema``); an Anthropic client is told the one it sent."""
    with pytest.raises(anthropic.BadRequestError) as err:
        claude.messages.create(**{"model": model_name, "max_tokens": 4, "messages": ASK, "stream": stream,
                                  **body})
    assert err.value.body["error"]["message"].startswith(f"{field}: "), err.value.body


def test_the_model_list_is_anthropics_as_well_as_openais(claude, client, model_name):
    """One /v1/models serves both SDKs: each reads its own fields (all required ones present)."""
    page = claude.models.list()
    assert [m.id for m in page.data] == [m.id for m in client.models.list().data]
    for info in page.data:
        anthropic.types.ModelInfo.model_validate(info.to_dict())
    served = claude.models.retrieve(model_name)
    assert served.display_name == model_name and served.max_input_tokens >= 4096
    assert page.has_more is False and page.first_id == page.data[0].id
