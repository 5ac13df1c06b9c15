"""Tool plans, the parsers of the models' own tool-call formats and the OpenAI shapes (core logic:
no model needed)."""

from __future__ import annotations

import json

import jsonschema
import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.guided.grammar import from_extensions, from_response_format
from ruvllm.guided.tools import (
    REPLY_OR_CALL,
    detect_parser,
    hold_back,
    parse_tools,
    plan_tools,
    reply_or_call_schema,
    split_tool_calls,
    streamable,
    taught_conversation,
)
from ruvllm.server.openai.formatters import ChatFormatter
from ruvllm.types import FinishReason, GenerationResult, Timings, TokenOutput, Usage

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
HERMES_TEMPLATE = "{% if tools %}<tools>{{ tools | tojson }}</tools> use <tool_call>{% endif %}..."


class _Tok:
    def token_text(self, token_id: int) -> str:
        return ""


def _formatter(plan):
    return ChatFormatter("chatcmpl-x", "m", _Tok(), None, plan=plan)


#: The result the finish chunks below end with: stopped by the model.
STOPPED = GenerationResult(text="", token_ids=(), finish_reason=FinishReason.STOP, timings=Timings(),
                           usage=Usage(prompt_tokens=1, completion_tokens=1))


def test_detect_parser_from_template():
    assert detect_parser(None) is None
    assert detect_parser("{{ messages }}") is None  # no tools in the template: plain text
    assert detect_parser(HERMES_TEMPLATE) == "hermes"
    assert detect_parser("{% if tools %}[TOOL_CALLS]{% endif %}") == "mistral"
    assert detect_parser("{% if tools %}<|python_tag|>{% endif %}") == "llama3"


def test_plan_modes_and_errors():
    assert plan_tools(None, None, None, None).mode == "none"
    assert plan_tools([ADD], "none", None, HERMES_TEMPLATE).mode == "none"
    auto = plan_tools([ADD], None, None, HERMES_TEMPLATE)
    assert auto.mode == "auto" and auto.parser == "hermes" and auto.parses_output
    assert auto.instructions is None and auto.rendered is not None
    named = plan_tools([ADD], {"type": "function", "function": {"name": "add"}}, None, None)
    assert named.enforced and named.grammar is not None and named.grammar.field == "tools"
    with pytest.raises(InvalidRequest) as e:
        plan_tools([ADD], {"type": "function", "function": {"name": "sub"}}, None, None)
    assert e.value.field == "tool_choice.function.name"
    with pytest.raises(InvalidRequest) as e:
        plan_tools([ADD, ADD], "required", None, None)
    assert e.value.field == "tools[1].function.name"
    with pytest.raises(InvalidRequest):
        plan_tools(None, "required", None, None)


def test_hermes_calls_are_parsed_and_text_before_them_kept():
    plan = plan_tools([ADD], "auto", None, HERMES_TEMPLATE)
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>\n' \
           '<tool_call>{"name": "add", "arguments": {"a": 3, "b": 4}}</tool_call>'
    content, calls = split_tool_calls(text, plan)
    assert content == "Let me add."
    assert [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2}),
                                                                   ("add", {"a": 3, "b": 4})]
    assert split_tool_calls("no calls here", plan) == ("no calls here", [])
    # An unknown function is not a call: the text stays text.
    assert split_tool_calls('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', plan)[1] == []


def test_mistral_and_llama3_formats():
    mistral = plan_tools([ADD], "auto", None, "{% if tools %}[TOOL_CALLS]{% endif %}")
    _, calls = split_tool_calls('[TOOL_CALLS] [{"name": "add", "arguments": {"a": 1, "b": 1}}]', mistral)
    assert [c.name for c in calls] == ["add"]
    llama = plan_tools([ADD], "auto", None, "{% if tools %}<|python_tag|>{% endif %}")
    _, calls = split_tool_calls('{"name": "add", "parameters": {"a": 5, "b": 6}}', llama)
    assert calls[0].arguments == {"a": 5, "b": 6}


def test_hold_back_keeps_possible_marker_starts():
    plan = plan_tools([ADD], "auto", None, HERMES_TEMPLATE)
    assert hold_back("Hello <tool", plan) == len(" <tool")
    assert hold_back("Hello", plan) == 0
    assert hold_back("Hello \n", plan) == 2  # whitespace may precede a call: stripped then
    assert hold_back("Hi <tool_call>{", plan) == len(" <tool_call>{")


def test_streamed_auto_output_becomes_content_then_tool_call_deltas():
    plan = plan_tools([ADD], "auto", None, HERMES_TEMPLATE)
    fmt = _formatter(plan)
    pieces = ["Sure", ". ", "<tool", "_call>", '{"name": "add", ', '"arguments": {"a": 1, "b": 2}}',
              "</tool_call>"]
    sent = [fmt.token(0, TokenOutput(index=i, token_id=i, text=p)) for i, p in enumerate(pieces)]
    content = "".join(c["choices"][0]["delta"]["content"] for c in sent if c is not None)
    # The same content as the whole answer's (whitespace before the call is not content).
    assert content == "Sure."
    assert split_tool_calls("".join(pieces), plan)[0] == "Sure."
    last = fmt.finish(0, STOPPED)["choices"][0]
    assert last["finish_reason"] == "tool_calls"
    call = last["delta"]["tool_calls"][0]
    assert call["index"] == 0 and call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "add" and json.loads(call["function"]["arguments"]) == {"a": 1, "b": 2}


def test_response_format_and_extensions():
    assert from_response_format(None) is None
    assert from_response_format({"type": "text"}) is None
    assert from_response_format({"type": "json_object"}).kind == "json_object"
    with pytest.raises(InvalidRequest) as e:
        from_response_format({"type": "json_schema"})
    assert e.value.field == "response_format.json_schema"
    with pytest.raises(InvalidRequest):
        from_extensions(guided_regex="a", guided_choice=["b"])
    with pytest.raises(InvalidRequest) as e:
        from_extensions(guided_json="{not json")
    assert e.value.field == "guided_json"


def test_a_template_without_tools_gets_them_taught_and_auto_constrained():
    auto = plan_tools([ADD], "auto", None, "{{ messages }}")
    assert auto.parser == REPLY_OR_CALL and auto.parses_output and not auto.enforced
    assert auto.rendered is None and auto.grammar is not None and auto.grammar.field == "tools"
    schema = json.loads(auto.grammar.source)
    assert [sorted(b["properties"]) for b in schema["anyOf"]] == [["response"], ["tool_calls"]]
    assert all(b["additionalProperties"] is False for b in schema["anyOf"])
    assert '"name": "add"' in auto.instructions and '"response"' in auto.instructions
    one = plan_tools([ADD], "auto", False, "{{ messages }}")
    assert json.loads(one.grammar.source)["anyOf"][1]["properties"]["tool_calls"]["maxItems"] == 1
    required = plan_tools([ADD], "required", None, "{{ messages }}")
    assert required.enforced and '"name": "add"' in required.instructions
    assert "response" not in required.instructions
    # A template that renders tools teaches them itself.
    assert plan_tools([ADD], "required", None, HERMES_TEMPLATE).instructions is None


def test_reply_or_call_answers_are_read_back():
    plan = plan_tools([ADD], "auto", None, "{{ messages }}")
    assert split_tool_calls('{"response": "Hi \\"there\\"\\n"}', plan) == ('Hi "there"\n', [])
    answer = '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}'
    content, calls = split_tool_calls(answer, plan)
    assert content == "" and [(c.name, c.arguments) for c in calls] == [("add", {"a": 1, "b": 2})]
    # Cut short by max_tokens: the reply as far as it got; a call cut short is neither.
    assert split_tool_calls('{"response": "Hello wor', plan) == ("Hello wor", [])
    assert split_tool_calls('{"tool_calls": [{"name": "ad', plan) == ("", [])


def test_a_reply_or_call_reply_says_something():
    """``{"response": ""}`` would reach the client as an answer with neither text nor a call."""
    schema = reply_or_call_schema(parse_tools([ADD]), max_calls=None)
    jsonschema.validate({"response": "Hi"}, schema)
    jsonschema.validate({"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"response": ""}, schema)


def test_a_reply_streams_decoded_as_it_comes():
    plan = plan_tools([ADD], "auto", None, "{{ messages }}")
    pieces = ['{"', 'response', '": "', "Caf", "\\u00e9", " \\", '"ok\\"', '"}']
    seen = ["".join(pieces[:k]) for k in range(1, len(pieces) + 1)]
    assert [streamable(t, plan) for t in seen] == ["", "", "", "Caf", "Café", "Café ", 'Café "ok"',
                                                   'Café "ok"']
    assert streamable('{"response": "\\ud83d', plan) == ""  # half a surrogate pair waits
    assert streamable('{"response": "\\ud83d\\ude00', plan) == "\U0001F600"
    fmt = _formatter(plan)
    sent = [fmt.token(0, TokenOutput(index=i, token_id=i, text=p)) for i, p in enumerate(pieces)]
    streamed = "".join(c["choices"][0]["delta"]["content"] for c in sent if c is not None)
    last = fmt.finish(0, STOPPED)["choices"][0]
    assert streamed == 'Café "ok"' and "content" not in last["delta"] and last["finish_reason"] == "stop"
    calls = _formatter(plan)
    text = '{"tool_calls": [{"name": "add", "arguments": {"a": 1, "b": 2}}]}'
    assert all(calls.token(0, TokenOutput(index=i, token_id=i, text=c)) is None for i, c in enumerate(text))
    last = calls.finish(0, STOPPED)["choices"][0]
    assert last["finish_reason"] == "tool_calls"
    assert last["delta"]["tool_calls"][0]["function"]["name"] == "add"


def test_the_conversation_teaches_tools_calls_and_results():
    plan = plan_tools([ADD], "auto", None, "{{ messages }}")
    call = {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}}
    taught = taught_conversation([{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "1+2?"},
                                  {"role": "assistant", "content": "", "tool_calls": [call]},
                                  {"role": "tool", "tool_call_id": "call_1", "content": "3"}], plan)
    assert taught[0] == {"role": "system", "content": "Be brief.\n\n" + plan.instructions}
    assert json.loads(taught[2]["content"]) == {"tool_calls": [call["function"]]}
    assert taught[3] == {"role": "user", "content": "Result of tool call call_1: 3"}
    assert taught_conversation([{"role": "user", "content": "hi"}], plan)[0]["role"] == "system"
    native = plan_tools([ADD], "auto", None, HERMES_TEMPLATE)
    hi = [{"role": "user", "content": "hi"}]
    assert taught_conversation(hi, native) == hi


def test_objects_are_closed_unless_the_schema_opens_them():
    from ruvllm.guided.grammar import json_schema_grammar, strict_objects

    schema = {"type": "object", "properties": {
        "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
        "b": {"type": "object", "properties": {}, "additionalProperties": True},
        "c": {"type": "array", "items": {"type": "object", "properties": {"y": {}}}},
        "d": {"anyOf": [{"type": "object", "properties": {"z": {}}}, {"type": "null"}]},
        "e": {"type": "object"}},
        "$defs": {"p": {"type": "object", "properties": {"q": {}}}}}
    strict = strict_objects(schema)
    assert strict["additionalProperties"] is False
    props = strict["properties"]
    assert props["a"]["additionalProperties"] is False
    assert props["b"]["additionalProperties"] is True  # opened by the schema: kept
    assert props["c"]["items"]["additionalProperties"] is False
    assert props["d"]["anyOf"][0]["additionalProperties"] is False
    assert props["d"]["anyOf"][1] == {"type": "null"}
    assert "additionalProperties" not in props["e"]  # names no properties: any object, as before
    assert strict["$defs"]["p"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the request's own schema is not changed
    assert json.loads(json_schema_grammar("response_format", schema).source) == strict
