"""response_format / guided_* / tools through the official openai client, against the real server
(llamacpp backend, embedded SmolLM2, temperature 0.8): every constrained output must validate."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest

S = {"type": "string", "maxLength": 24}
# No free "number" fields: JSON numbers have no length limit, and at temperature 0.8 a small model
# can write decimals until max_tokens (finish "length"); see docs/structured-output.md.
INT = {"type": "integer"}


def obj(required: list[str] | None = None, **props) -> dict:
    """A closed object schema; every property required unless ``required`` says otherwise."""
    return {"type": "object", "properties": props, "additionalProperties": False,
            "required": list(props) if required is None else required}


def ints(lo: int, hi: int) -> dict:
    return {"type": "integer", "minimum": lo, "maximum": hi}


SCHEMAS = [
    obj(name=S, age=ints(0, 120)),
    obj(ok={"type": "boolean"}),
    obj(color={"enum": ["red", "green", "blue"]}),
    obj(tags={"type": "array", "items": S, "minItems": 1, "maxItems": 3}),
    obj(x=ints(-1000, 1000), y=ints(-1000, 1000)),
    {"type": "array", "items": ints(1, 9), "minItems": 2, "maxItems": 4},
    obj(city=S, country={"type": "string", "pattern": "^[A-Z]{2}$"}),
    obj(user=obj(id=INT, email=S)),
    obj(answer={"type": "string", "enum": ["yes", "no", "maybe"]},
        confidence_percent=ints(0, 100)),
    obj(value={"anyOf": [INT, {"type": "string", "maxLength": 8}]}),
    obj(["title"], title=S, year=ints(1900, 2030)),
    obj(note={"type": ["string", "null"], "maxLength": 16}),
    obj(items={"type": "array", "maxItems": 2, "items": obj(sku=S, qty=ints(1, 50))}),
    obj(status={"const": "done"}, code=INT),
    obj(date={"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}),
    obj(a=INT, b=INT, sum=INT),
    obj(matrix={"type": "array", "maxItems": 2,
                "items": {"type": "array", "items": ints(0, 9), "minItems": 2, "maxItems": 2}}),
    obj(kind={"enum": ["cat", "dog"]}, legs=ints(0, 8)),
    obj(["first", "last"], first=S, last=S, middle=S),
    obj(score=ints(-5, 5), valid={"type": "boolean"}, label=S),
]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": S, "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Add two integers",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
PARAMS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def _parallel(fn, args):
    with ThreadPoolExecutor(max_workers=len(args)) as pool:
        return list(pool.map(fn, args))


def test_twenty_json_schemas_validate_at_temperature_0_8(oai, model_name):
    def ask(i_schema):
        i, schema = i_schema
        r = oai.chat.completions.create(
            model=model_name, temperature=0.8, max_tokens=160, seed=i,
            messages=[{"role": "user", "content": "Reply with a JSON value for this task."}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": f"s{i}", "schema": schema, "strict": True}})
        return r.choices[0]

    choices = _parallel(ask, list(enumerate(SCHEMAS)))
    for schema, choice in zip(SCHEMAS, choices, strict=True):
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)


def test_json_object_is_a_json_object(oai, model_name):
    r = oai.chat.completions.create(model=model_name, temperature=0.8, max_tokens=200, seed=3,
                                    messages=[{"role": "user", "content": "Describe a cat in JSON."}],
                                    response_format={"type": "json_object"})
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:  # an unbounded object may run out of tokens; what was produced is still a JSON prefix
        assert r.choices[0].message.content.startswith("{")


def _check_calls(choice, allowed):
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), PARAMS[call.function.name])


def test_tool_choice_required_gives_valid_calls_20_of_20(oai, model_name):
    def ask(i):
        return oai.chat.completions.create(
            model=model_name, temperature=0.8, max_tokens=160, seed=i, tools=TOOLS, tool_choice="required",
            parallel_tool_calls=False,
            messages=[{"role": "user", "content": "Weather in Paris? And 2 + 3?"}]).choices[0]

    for choice in _parallel(ask, list(range(20))):
        _check_calls(choice, {"get_weather", "add"})
        assert len(choice.message.tool_calls) == 1


def test_named_tool_choice_gives_valid_calls_20_of_20(oai, model_name):
    def ask(i):
        return oai.chat.completions.create(
            model=model_name, temperature=0.8, max_tokens=160, seed=100 + i, tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "add"}},
            messages=[{"role": "user", "content": "Add 40 and 2."}]).choices[0]

    for choice in _parallel(ask, list(range(20))):
        _check_calls(choice, {"add"})


def test_streamed_tool_call_deltas_accumulate_to_a_valid_call(oai, model_name):
    stream = oai.chat.completions.create(
        model=model_name, temperature=0.8, max_tokens=160, seed=7, tools=TOOLS, stream=True,
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        messages=[{"role": "user", "content": "Weather in Oslo?"}])
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        for choice in chunk.choices:
            assert not choice.delta.content, "an enforced call streams no content"
            for d in choice.delta.tool_calls or ():
                entry = calls.setdefault(d.index, {"name": "", "arguments": ""})
                entry["name"] += d.function.name or ""
                entry["arguments"] += d.function.arguments or ""
            finish = choice.finish_reason or finish
    assert finish == "tool_calls"
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), PARAMS["get_weather"])


def test_guided_regex_and_choice_on_completions(oai, model_name):
    r = oai.completions.create(model=model_name, prompt="Is water wet? Answer:", max_tokens=30,
                                  temperature=0.8, extra_body={"guided_regex": r" (yes|no), [a-z ]{3,20}\."})
    assert re.fullmatch(r" (yes|no), [a-z ]{3,20}\.", r.choices[0].text), r.choices[0].text
    r = oai.completions.create(model=model_name, prompt="Pick a color:", max_tokens=10, temperature=0.8,
                                  extra_body={"guided_choice": ["red", "green"]})
    assert r.choices[0].text in ("red", "green")


def test_structured_outputs_is_vllms_current_spelling(oai, model_name):
    """vLLM 0.12 removed ``guided_*`` for ``structured_outputs``: each of its constraints holds."""
    r = oai.completions.create(model=model_name, prompt="Is water wet? Answer:", max_tokens=30,
                               temperature=0.8,
                               extra_body={"structured_outputs": {"regex": r" (yes|no), [a-z ]{3,20}\."}})
    assert re.fullmatch(r" (yes|no), [a-z ]{3,20}\.", r.choices[0].text), r.choices[0].text
    ask = {"model": model_name, "max_tokens": 40, "temperature": 0.8,
           "messages": [{"role": "user", "content": "Describe a cat."}]}
    r = oai.chat.completions.create(**ask, extra_body={"structured_outputs": {"choice": ["red", "green"]}})
    assert r.choices[0].message.content in ("red", "green")
    schema = SCHEMAS[1]
    r = oai.chat.completions.create(**{**ask, "max_tokens": 160, "seed": 1}, extra_body={
        "structured_outputs": {"json": schema, "disable_any_whitespace": True,
                               "disable_additional_properties": True}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    jsonschema.validate(json.loads(r.choices[0].message.content), schema)
    r = oai.chat.completions.create(**ask, extra_body={"structured_outputs": {"json_object": True}})
    assert r.choices[0].message.content.startswith("{")  # an unbounded object may run out of tokens
    assign = {**ask, "max_tokens": 12, "messages": [{"role": "user", "content": "Assign x."}]}
    r = oai.chat.completions.create(**assign, extra_body={"structured_outputs": {
        "grammar": 'start: "x=" /[0-9]{1,3}/ ";"'}})
    assert re.fullmatch(r"x=[0-9]{1,3};", r.choices[0].message.content)


@pytest.mark.parametrize("grammar", [
    'start: "x=" NUM ";"\nNUM: /[0-9]{1,3}/',
    # vLLM's guided_grammar under xgrammar is llama.cpp's GBNF: llguidance translates it.
    'root ::= "x=" num ";"\nnum ::= [0-9] [0-9]? [0-9]?',
], ids=["lark", "gbnf"])
def test_a_grammar_on_chat(oai, model_name, grammar):
    r = oai.chat.completions.create(model=model_name, max_tokens=12, temperature=0.8,
                                    messages=[{"role": "user", "content": "Assign x."}],
                                    extra_body={"guided_grammar": grammar})
    assert re.fullmatch(r"x=[0-9]{1,3};", r.choices[0].message.content)


@pytest.mark.parametrize(("body", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "b", "schema": {"type": "bogus"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format"),
    ({"extra_body": {"guided_regex": "[a-"}}, "guided_regex"),
    ({"extra_body": {"guided_grammar": "root ::= ("}}, "guided_grammar"),
    ({"extra_body": {"structured_outputs": {"regex": "[a-"}}}, "structured_outputs.regex"),
    ({"extra_body": {"structured_outputs": {"regex": "a", "choice": ["a"]}}}, "structured_outputs.regex"),
    ({"extra_body": {"structured_outputs": {"choice": ["a"]}, "guided_choice": ["b"]}},
     "structured_outputs.choice"),
    ({"extra_body": {"structured_outputs": {"structural_tag": "{}"}}}, "structured_outputs.structural_tag"),
    ({"extra_body": {"structured_outputs": {"jsn": {}}}}, "structured_outputs.jsn"),
    ({"response_format": {"type": "json_object"},
      "extra_body": {"structured_outputs": {"json_object": True}}}, "structured_outputs.json_object"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}},
     "response_format"),
])
def test_unusable_constraints_are_400_naming_the_field(oai, model_name, body, param):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=model_name, max_tokens=8,
                                    messages=[{"role": "user", "content": "hi"}], **body)
    assert info.value.body["param"] == param, info.value.body
