"""OpenAI's Responses API through the official ``openai`` client, on the embedded model.

The surface is thin (server/openai/responses_api.py, responses_output.py): what it must show is that a
client written for the Responses API gets the same answers as a chat client does from the same
core, in the Responses API's shapes: the same greedy text and token counts as
``/v1/chat/completions``, a stream of the documented events that adds up to the whole response
(and that the SDK's ``responses.stream`` helper accumulates), ``max_output_tokens`` as an
incomplete response, structured output, a function-call round trip, refusals naming the field.
Stored responses (``previous_response_id``, ``GET``, ``background``) are test_stored_responses.py's.

Answers compared with each other run warm: the first run of a prompt computes it whole, later
runs reuse its cached prefix, whose llama.cpp kernels round differently, and that can change a
greedy token of this 135M Q4 model (measured: a cold 18-token answer, then 38-token ones).
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}
ASK = "What is the weather in Oslo?"
CONVERSATION = [
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": [{"type": "output_text", "text": "Blue."}]},
    {"role": "user", "content": [{"type": "input_text", "text": "And another one?"}]},
]
LOGPROBS = "message.output_text.logprobs"


def _greedy(model: str, question: str, max_output_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"model": model, "input": question, "max_output_tokens": max_output_tokens, "temperature": 0,
            **extra}


def _warm(client, body: dict[str, Any]) -> None:
    """Put the prompt in the prefix cache, so that the answers compared next both reuse it."""
    client.responses.create(**{**body, "max_output_tokens": 1})


def test_the_same_conversation_gives_the_same_answer_as_chat(client, model_name):
    body = {"model": model_name, "instructions": "Be brief.", "input": CONVERSATION, "max_output_tokens": 24,
            "temperature": 0}
    _warm(client, body)
    response = client.responses.create(**body, metadata={"ticket": "7"}, store=True)
    chat = client.chat.completions.create(
        model=model_name, max_tokens=24, temperature=0,
        messages=[{"role": "system", "content": "Be brief."}, CONVERSATION[0],
                  {"role": "assistant", "content": "Blue."}, {"role": "user", "content": "And another one?"}])
    assert response.object == "response" and response.id.startswith("resp") and response.model == model_name
    (message,) = response.output
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert response.output_text == chat.choices[0].message.content
    assert response.status == {"stop": "completed", "length": "incomplete"}[chat.choices[0].finish_reason]
    assert message.status == response.status
    usage = response.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (
        chat.usage.prompt_tokens, chat.usage.completion_tokens, chat.usage.total_tokens)
    echoed = response.to_dict()
    assert echoed["metadata"] == {"ticket": "7"} and echoed["instructions"] == "Be brief."
    assert echoed["store"] is True and echoed["background"] is False  # kept (test_stored_responses.py)


def test_a_developer_item_is_the_instructions_turn(client, model_name):
    """Both reach the chat template as the system turn (chat's message_dicts maps developer)."""
    with_instructions = {**_greedy(model_name, ASK, 8), "instructions": "Be brief."}
    with_developer = _greedy(model_name, [{"role": "developer", "content": "Be brief."},
                                          {"role": "user", "content": ASK}], 8)
    _warm(client, with_instructions)
    answers = [client.responses.create(**body) for body in (with_instructions, with_developer)]
    assert answers[0].usage.input_tokens == answers[1].usage.input_tokens
    assert answers[0].output_text == answers[1].output_text


def test_logprobs_are_chats(client, model_name):
    body = _greedy(model_name, "Say hi.", 4)
    _warm(client, body)
    response = client.responses.create(**body, include=[LOGPROBS], top_logprobs=2)
    chat = client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Say hi."}],
                                          max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    part = response.output[0].content[0]
    expected = chat.choices[0].logprobs.content
    assert [(lp.token, lp.logprob) for lp in part.logprobs] == [(lp.token, lp.logprob) for lp in expected]
    assert [len(lp.top_logprobs) for lp in part.logprobs] == [2] * len(expected)


def test_a_stream_adds_up_to_the_response(client, model_name):
    body = _greedy(model_name, "What is 2+2?", 24)
    _warm(client, body)
    whole = client.responses.create(**body)
    assert whole.status == "completed", whole.output_text  # the helper below needs a completed answer
    events = list(client.responses.create(**body, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                          "response.output_item.done", "response.completed"]
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    done = events[-4]
    final = events[-1].response
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == done.text == final.output_text == whole.output_text
    # The same counts; how much of the prompt the cache held differs from one request to the next.
    cacheless = {"input_tokens_details"}
    assert final.usage.model_dump(exclude=cacheless) == whole.usage.model_dump(exclude=cacheless)
    assert final.id == events[0].response.id
    assert events[2].item.id == final.output[0].id
    with client.responses.stream(**body) as stream:
        texts = [e.delta for e in stream if e.type == "response.output_text.delta"]
        helped = stream.get_final_response()
    assert "".join(texts) == helped.output_text == whole.output_text


def test_max_output_tokens_makes_an_incomplete_response(client, model_name):
    body = _greedy(model_name, "Write a long story about a dragon.", 3)
    _warm(client, body)
    whole = client.responses.create(**body)
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert whole.usage.output_tokens == 3 and whole.output[0].status == "incomplete"
    events = list(client.responses.create(**body, stream=True))
    last = events[-1].response
    assert events[-1].type == "response.incomplete" and last.incomplete_details.reason == "max_output_tokens"
    assert last.output_text == whole.output_text == "".join(
        e.delta for e in events if e.type == "response.output_text.delta")


def test_structured_output_follows_the_schema(client, model_name):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
              "required": ["colour"]}
    response = client.responses.create(
        model=model_name, input="Pick a colour.", max_output_tokens=30,
        text={"format": {"type": "json_schema", "name": "colour", "schema": schema, "strict": True}})
    assert response.status == "completed"
    # Closed by default: no property the schema does not name.
    jsonschema.validate(json.loads(response.output_text), {**schema, "additionalProperties": False})


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_function_call_round_trip(client, model_name, stream):
    """The model calls the tool (a function_call item whose arguments validate), and answers the
    tool's output, sent back with the call as input items, in text."""
    body = _greedy(model_name, ASK, 60, tools=[WEATHER])
    if stream:
        with client.responses.stream(**body) as events:
            kinds = [e.type for e in events]
            response = events.get_final_response()
        assert kinds[2:6] == ["response.output_item.added", "response.function_call_arguments.delta",
                              "response.function_call_arguments.done", "response.output_item.done"]
    else:
        response = client.responses.create(**body)
    (call,) = response.output
    assert call.type == "function_call" and call.name == "get_weather" and call.call_id.startswith("call_")
    jsonschema.validate(json.loads(call.arguments), {**WEATHER["parameters"], "additionalProperties": False})
    reply = client.responses.create(
        model=model_name, tools=[WEATHER], max_output_tokens=40, temperature=0,
        input=[{"role": "user", "content": ASK}, *response.output,
               {"type": "function_call_output", "call_id": call.call_id, "output": "sunny, 21 C"}])
    assert [o.type for o in reply.output] == ["message"] and reply.output_text


@pytest.mark.parametrize(("body", "param"), [
    ({"conversation": {"id": "conv_0123", "name": "x"}}, "conversation"),
    ({"background": True, "store": False}, "background"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"reasoning": {"effort": "high"}}, "reasoning.effort"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "https://x.org/a.png"}]}]},
     "input[0].content[0].type"),
    ({"input": [{"type": "item_reference"}]}, "input[0].id"),
    # Malformed items, each once a 500 (issue 62): a type that is an object, an item that is not one.
    ({"input": [{"id": "0", "type": {}}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": {}, "text": "Hi"}]}]}, "input[0].content[0].type"),
    ({"input": [[None, None]]}, "input[0]"),
    # Earlier reasoning is dropped (test_reasoning, test_field_table): alone it leaves nothing to answer.
    ({"input": [{"type": "reasoning", "id": "rs_1", "summary": []}]}, "input"),
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"include": ["file_search_call.results"]}, "include[0]"),
    ({"top_logprobs": 2}, "top_logprobs"),
    # Refusals of the shared chat path, in this API's names.
    ({"max_output_tokens": 100_000}, "max_output_tokens"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "name": "get_time"}}, "tool_choice.name"),
    ({"input": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"},
                {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{oops"}]},
     "input[2].arguments"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_refusals_name_the_field(client, model_name, body, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**{"model": model_name, "input": "Hi", "max_output_tokens": 4, **body})
    error = err.value.body
    assert error["param"] == param and error["message"].startswith(param) and error["type"] == \
        "invalid_request_error", error


def test_a_context_overflow_names_the_input(client, model_name):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model=model_name, input="word " * 12_000, max_output_tokens=4)
    error = err.value.body
    assert error["param"] == "input" and error["code"] == "context_length_exceeded", error


def test_a_response_not_stored_here_is_a_404_saying_so(client):
    for call in (lambda: client.responses.retrieve("resp-0123"), lambda: client.responses.delete("resp-0123"),
                 lambda: client.responses.cancel("resp-0123"),
                 lambda: client.responses.input_items.list("resp-0123"),
                 lambda: client.responses.create(input="Hi", previous_response_id="resp-0123")):
        with pytest.raises(openai.NotFoundError) as err:
            call()
        assert "no response 'resp-0123'" in err.value.body["message"], err.value.body


def test_strict_is_refused_where_the_calls_are_not_constrained():
    """Under auto a model whose template renders tools (Hermes here) writes its own call format,
    parsed but not constrained: ``strict: true`` is refused there, served everywhere else."""
    from ruvllm.errors import InvalidRequest
    from ruvllm.server.openai.responses_api import check_strict
    from ruvllm.server.openai.responses_schema import ResponsesRequest

    hermes = "{% for tool in tools %}{{ tool }}{% endfor %}<tool_call>"
    body = ResponsesRequest(input="Hi", tools=[WEATHER])
    with pytest.raises(InvalidRequest) as err:
        check_strict(body, hermes)
    assert err.value.field == "tools[0].strict"
    check_strict(body, None)  # taught the tools by ruvllm: the reply_or_call grammar constrains them
    check_strict(ResponsesRequest(input="Hi", tools=[WEATHER], tool_choice="required"), hermes)
    check_strict(ResponsesRequest(input="Hi", tools=[{**WEATHER, "strict": False}]), hermes)
