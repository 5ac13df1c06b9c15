"""Tool plans, the parsers of the models' own tool-call formats and the OpenAI shapes (core logic:
no model needed)."""

from __future__ import annotations

import json

import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.guided.grammar import from_extensions, from_response_format
from ruvllm.guided.tools import detect_parser, hold_back, plan_tools, split_tool_calls
from ruvllm.server.tool_responses import ToolChatFormatter
from ruvllm.types import TokenOutput

ADD = {"type": "function", "function": {"name": "add", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
HERMES_TEMPLATE = "{% if tools %}<tools>{{ tools | tojson }}</tools> use <tool_call>{% endif %}..."


class _Tok:
    def token_text(self, token_id: int) -> str:
        return ""


def _formatter(plan):
    return ToolChatFormatter("chatcmpl-x", "m", _Tok(), None, plan=plan)


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
    assert not plan_tools([ADD], "auto", None, "{{ messages }}").parses_output
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
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("add", {"a": 1, "b": 2}),
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
    assert json.loads(calls[0].arguments) == {"a": 5, "b": 6}


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
    last = fmt.finish(0, "stop")["choices"][0]
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
