"""docs/server.md's "Request fields" table is the list of every request field, and it is kept true.

The table states, for every field of every endpoint's request (body fields at any depth, and
query parameters), whether it is honoured, refused unless a stated value, or accepted unused
with the reason. Here the table is diffed against the request schemas of the app's routes both
ways (a field added to a schema without a decision fails, so does a documented field the schema
lacks), and it is checked through the real server (llamacpp on the embedded model): an unknown
field is a 400 naming it on every endpoint and inside every nested object, each ``refused``
field is a 400 naming it, and each ``accepted`` field leaves the answer as it is without it.
Path parameters (``/v1/models/{model_id}``) are the resource, not a field, and are not listed.
"""

from __future__ import annotations

import json
import re
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel
from ruvllm.server.http.strict_fields import RequestBody
from server_helpers import API_KEY, RunningServer

DOC = Path(__file__).resolve().parents[2] / "docs" / "server.md"
AUTH = {"Authorization": f"Bearer {API_KEY}"}
UNKNOWN = "bogus_field"
_KINDS = {"honoured": "honoured", "accepted, unused": "accepted", "refused unless": "refused"}


def _section(text: str) -> str:
    assert "\n## Request fields\n" in text, "docs/server.md has no '## Request fields' section"
    return text.split("\n## Request fields\n", 1)[1].split("\n## ", 1)[0]


def documented_endpoints(text: str) -> dict[str, tuple[str, str]]:
    """The table's endpoint labels: label -> (method, path), from the legend above it."""
    legend = re.findall(r"`(\w+)` =\s+`(GET|POST) (/\S*)`", _section(text))
    labels = {label: (method, path) for label, method, path in legend}
    assert len(labels) == len(legend), f"a label is defined twice: {legend}"
    return labels


def documented_fields(text: str) -> dict[tuple[str, str], str]:
    """(endpoint label, field path) -> kind (``honoured``, ``accepted`` or ``refused``)."""
    labels = documented_endpoints(text)
    table: dict[tuple[str, str], str] = {}
    for line in _section(text).splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
        assert len(cells) == 3, f"a row is field | endpoints | decision: {line}"
        fields, endpoints, decision = cells
        kind = next((k for prefix, k in _KINDS.items() if decision.startswith(prefix)), None)
        assert kind is not None, f"a decision starts with one of {list(_KINDS)}: {line}"
        reason = decision.split(":", 1)[1].strip() if ":" in decision else ""
        assert len(reason) > 10, f"a decision says why after a colon: {line}"
        for endpoint in (e.strip() for e in endpoints.split(",")):
            assert endpoint in labels, f"unknown endpoint label {endpoint!r} in: {line}"
            for field in re.findall(r"`([^`]+)`", fields):
                assert (endpoint, field) not in table, f"{endpoint} {field} is listed twice"
                table[(endpoint, field)] = kind
    assert table, "the Request fields table has no rows"
    return table


DOC_TEXT = DOC.read_text(encoding="utf-8")
ENDPOINTS = documented_endpoints(DOC_TEXT)
TABLE = documented_fields(DOC_TEXT)


# --- the schemas, from the app's routes ---------------------------------------------------------

def _nested_models(annotation: Any, path: str) -> Iterator[tuple[str, type[BaseModel]]]:
    """Models inside a field's type, with their path: ``messages[]`` for a list's items."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield path, annotation
        return
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (list, tuple, set, frozenset):
        for arg in args:
            yield from _nested_models(arg, path + "[]")
    elif origin is dict:
        for arg in args[1:]:
            yield from _nested_models(arg, path + "{}")
    elif origin in (typing.Union, types.UnionType, typing.Annotated):
        for arg in args:
            yield from _nested_models(arg, path)


def model_fields(model: type[BaseModel], prefix: str = "") -> tuple[set[str], dict[str, type[BaseModel]]]:
    """Every field path of ``model`` at any depth, and the nested models by path."""
    fields: set[str] = set()
    nested: dict[str, type[BaseModel]] = {}
    for name, info in model.model_fields.items():
        path = prefix + (info.alias or name)
        fields.add(path)
        for sub_path, sub in _nested_models(info.annotation, path):
            nested[sub_path] = sub
            sub_fields, sub_nested = model_fields(sub, sub_path + ".")
            fields |= sub_fields
            nested |= sub_nested
    return fields, nested


def _dependants(dependant: Any) -> Iterator[Any]:
    yield dependant
    for sub in dependant.dependencies:
        yield from _dependants(sub)


@pytest.fixture(scope="module")
def routes(server: RunningServer) -> dict[tuple[str, str], tuple[set[str], dict[str, type[BaseModel]]]]:
    """(method, path) -> (field paths, nested models) of every route that takes fields."""
    out = {}
    for route in server.server.config.app.routes:
        if not isinstance(route, APIRoute):
            continue
        fields: set[str] = set()
        nested: dict[str, type[BaseModel]] = {}
        for dependant in _dependants(route.dependant):
            fields |= {p.alias for p in dependant.query_params}
            for param in dependant.body_params:
                body = param.field_info.annotation
                assert isinstance(body, type) and issubclass(body, BaseModel), \
                    f"{route.path}'s body is not one pydantic model: {body}"
                body_fields, body_nested = model_fields(body)
                fields |= body_fields
                nested |= {"": body, **body_nested}
        if fields:
            for method in route.methods:
                out[(method, route.path)] = (fields, nested)
    return out


def _schema_table(routes) -> set[tuple[str, str]]:
    by_route = {route: label for label, route in ENDPOINTS.items()}
    missing = sorted(set(routes) - set(by_route))
    assert not missing, f"routes that take fields have no endpoint label in docs/server.md: {missing}"
    return {(by_route[route], field) for route, (fields, _) in routes.items() for field in fields}


def test_the_table_lists_every_schema_field_and_no_other(routes):
    schema = _schema_table(routes)
    undocumented = sorted(schema - set(TABLE))
    stale = sorted(set(TABLE) - schema)
    assert not undocumented, ("fields accepted by a request schema with no decision in docs/server.md's "
                              "Request fields table (honoured, refused unless, accepted, unused): "
                              f"{undocumented}")
    assert not stale, f"fields in docs/server.md's table that no request schema accepts: {stale}"


def test_every_documented_endpoint_is_a_route(routes):
    assert set(ENDPOINTS.values()) <= set(routes), sorted(set(ENDPOINTS.values()) - set(routes))


def test_every_request_model_forbids_unknown_fields(routes):
    """Pydantic's default (``extra="ignore"``) or ``"allow"`` anywhere would drop a misspelt
    field silently; every body and every object inside one forbids them."""
    lenient = sorted(f"{path} {where or '(body)'}: {model.__name__} extra={model.model_config.get('extra')}"
                     for path, (_, nested) in routes.items() for where, model in nested.items()
                     if model.model_config.get("extra") != "forbid")
    assert not lenient, lenient


# --- through the real server --------------------------------------------------------------------

CHAT_MESSAGES = [{"role": "user", "content": "Say hello."}]
LLAMA = ("llama_completion", "llama_infill")
RERANK = ("rerank", "rerank_v1", "rerank_v2", "reranking", "reranking_v1")
COHERE = ("cohere_embed", "cohere_embed_v1")
#: A body each endpoint answers as it normally does, and the status it answers with. The LoRA
#: routes are off on this server (403 after the body parsed); the feedback id is unknown (404).
BASE: dict[str, tuple[dict[str, Any], int]] = {
    "chat": ({"messages": CHAT_MESSAGES, "max_tokens": 2, "temperature": 0}, 200),
    "completions": ({"prompt": "One, two, three, four, five,", "max_tokens": 2, "temperature": 0}, 200),
    "embeddings": ({"input": "The cat sat on the mat."}, 200),
    "tokenize": ({"prompt": "Hello there"}, 200),
    "apply_template": ({"messages": CHAT_MESSAGES}, 200),
    "detokenize": ({"tokens": [1, 2, 3]}, 200),
    "feedback": ({"id": "chatcmpl-no-such-completion", "score": 1}, 404),
    "load_lora": ({"lora_name": "terse", "lora_path": "/no/such/adapter"}, 403),
    "unload_lora": ({"lora_name": "terse"}, 403),
    "tokenizer_info": ({}, 200),
    "messages": ({"model": "default", "messages": CHAT_MESSAGES, "max_tokens": 2, "temperature": 0}, 200),
    "count_tokens": ({"model": "default", "messages": CHAT_MESSAGES}, 200),
    **{label: ({"model": "default", "stream": False, "options": {"num_predict": 2, "temperature": 0}, **body},
               200) for label, body in (("ollama_chat", {"messages": CHAT_MESSAGES}),
                                        ("ollama_generate", {"prompt": "Hi"}))},
    "ollama_show": ({"model": "default"}, 200),
    "ollama_pull": ({"model": "default", "stream": False}, 200),
    "ollama_embed": ({"model": "default", "input": "The cat sat on the mat."}, 200),
    "ollama_embeddings": ({"model": "default", "prompt": "The cat sat on the mat."}, 200),
    "responses": ({"model": "default", "input": "Say hello.", "max_output_tokens": 2, "temperature": 0}, 200),
    "llama_completion": ({"prompt": "One, two, three, four, five,", "n_predict": 2, "temperature": 0}, 200),
    # The embedded model has no fill-in-the-middle tokens: every field is checked before that 400.
    "llama_infill": ({"input_prefix": "def f(x):\n    ", "input_suffix": "\n    return y\n", "n_predict": 2},
                     400),
    # No such file: every field is checked before that 404.
    "batches": ({"input_file_id": "file-none", "endpoint": "/v1/chat/completions",
                 "completion_window": "24h"}, 404),
    "list_batches": ({}, 200),
    "list_files": ({}, 200),
    # The path's literal {response_id} names no stored response: the query is checked before that 404.
    "input_items": ({}, 404),
    "llama_embedding": ({"content": "The cat sat on the mat."}, 200),
    "llama_embeddings": ({"input": "The cat sat on the mat."}, 200),
    "props": ({}, 200),
    "conversations": ({"items": [{"role": "user", "content": "Hi"}], "metadata": {"topic": "x"}}, 200),
    # The paths' literal {conversation_id} names no conversation: every field is checked before that 404.
    "conversation_update": ({"metadata": {"topic": "x"}}, 404),
    "conversation_items": ({"items": [{"role": "user", "content": "Hi"}]}, 404),
    "list_conversation_items": ({}, 404),
    "message_batches": ({"requests": [{"custom_id": "a", "params": {"model": "default", "max_tokens": 1,
                                                                 "messages": CHAT_MESSAGES}}]}, 200),
    "list_message_batches": ({}, 200),
    **{label: ({"text_1": "The cat sat on the mat.", "text_2": ["A kitten sat.", "Stocks fell."]}, 200)
       for label in ("score", "score_v1")},
    **{label: ({"query": "What purrs?", "documents": ["Cats purr.", "Stocks fell."]}, 200)
       for label in RERANK},
    **{label: ({"texts": ["Cats purr."]}, 200) for label in COHERE},
    "list_chat_completions": ({}, 200),
    # The paths' literal {completion_id} names no stored completion: every field is checked before that 404.
    "chat_completion_update": ({"metadata": {"run": "x"}}, 404),
    "chat_completion_messages": ({}, 404),
}
ANTHROPIC = ("messages", "count_tokens")
_CONVERSATION_OBJECTS = {
    "messages[]": ({"messages": [{"role": "user", "content": "Hi", UNKNOWN: 1}]}, f"messages[0].{UNKNOWN}"),
    "messages[].content[]": ({"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi",
                                                                          UNKNOWN: 1}]}]},
                             f"messages[0].content[0].{UNKNOWN}"),
    "messages[].content[].cache_control": (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hi", "cache_control": {
            "type": "ephemeral", UNKNOWN: 1}}]}]}, f"messages[0].content[0].cache_control.{UNKNOWN}"),
    "messages[].content[].content[]": (
        {"messages": [{"role": "user", "content": [{
            "type": "tool_result", "tool_use_id": "toolu_1",
            "content": [{"type": "text", "text": "ok", UNKNOWN: 1}]}]}]},
        f"messages[0].content[0].content[0].{UNKNOWN}"),
    "messages[].content[].content[].cache_control": (
        {"messages": [{"role": "user", "content": [{
            "type": "tool_result", "tool_use_id": "toolu_1",
            "content": [{"type": "text", "text": "ok",
                         "cache_control": {"type": "ephemeral", UNKNOWN: 1}}]}]}]},
        f"messages[0].content[0].content[0].cache_control.{UNKNOWN}"),
    "system[]": ({"messages": CHAT_MESSAGES, "system": [{"type": "text", "text": "Be brief.", UNKNOWN: 1}]},
                 f"system[0].{UNKNOWN}"),
    "system[].cache_control": ({"messages": CHAT_MESSAGES, "system": [
        {"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral", UNKNOWN: 1}}]},
        f"system[0].cache_control.{UNKNOWN}"),
    "tools[]": ({"messages": CHAT_MESSAGES, "tools": [{"name": "f", "input_schema": {}, UNKNOWN: 1}]},
                f"tools[0].{UNKNOWN}"),
    "tools[].cache_control": ({"messages": CHAT_MESSAGES, "tools": [
        {"name": "f", "input_schema": {}, "cache_control": {"type": "ephemeral", UNKNOWN: 1}}]},
        f"tools[0].cache_control.{UNKNOWN}"),
    "tool_choice": ({"messages": CHAT_MESSAGES, "tool_choice": {"type": "auto", UNKNOWN: 1}},
                    f"tool_choice.{UNKNOWN}"),
    "thinking": ({"messages": CHAT_MESSAGES, "thinking": {"type": "disabled", UNKNOWN: 1}},
                 f"thinking.{UNKNOWN}"),
    "output_config": ({"messages": CHAT_MESSAGES, "output_config": {UNKNOWN: 1}}, f"output_config.{UNKNOWN}"),
    "output_config.format": ({"messages": CHAT_MESSAGES, "output_config": {"format": {
        "type": "json_schema", "schema": {}, UNKNOWN: 1}}}, f"output_config.format.{UNKNOWN}"),
    "cache_control": ({"messages": CHAT_MESSAGES, "cache_control": {"type": "ephemeral", UNKNOWN: 1}},
                      f"cache_control.{UNKNOWN}"),
}
_FUNCTION = {"type": "function", "name": "f"}
_CALLED = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
_RESPONSES_OBJECTS = {
    "input[]": ({"input": [{"role": "user", "content": "Hi", UNKNOWN: 1}]}, f"input[0].{UNKNOWN}"),
    "input[].content[]": ({"input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi",
                                                                    UNKNOWN: 1}]}]},
                          f"input[0].content[0].{UNKNOWN}"),
    "input[].output[]": ({"input": [_CALLED, {"type": "function_call_output", "call_id": "call_1",
                                              "output": [{"type": "input_text", "text": "ok", UNKNOWN: 1}]}]},
                         f"input[1].output[0].{UNKNOWN}"),
    "input[].summary[]": ({"input": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "Hm.",
                                                                        UNKNOWN: 1}]}]},
                          f"input[0].summary[0].{UNKNOWN}"),
    "tools[]": ({"tools": [{**_FUNCTION, UNKNOWN: 1}]}, f"tools[0].{UNKNOWN}"),
    "tool_choice": ({"tools": [_FUNCTION], "tool_choice": {**_FUNCTION, UNKNOWN: 1}},
                    f"tool_choice.{UNKNOWN}"),
    "text": ({"text": {UNKNOWN: 1}}, f"text.{UNKNOWN}"),
    "text.format": ({"text": {"format": {"type": "text", UNKNOWN: 1}}}, f"text.format.{UNKNOWN}"),
    "reasoning": ({"reasoning": {UNKNOWN: 1}}, f"reasoning.{UNKNOWN}"),
}
OLLAMA = ("ollama_chat", "ollama_generate")
_OLLAMA_CALL = {"function": {"name": "f", "arguments": {}}}
_OLLAMA_OBJECTS = {
    "messages[]": ({"messages": [{"role": "user", "content": "Hi", UNKNOWN: 1}]}, f"messages[0].{UNKNOWN}"),
    "messages[].tool_calls[]": (
        {"messages": [*CHAT_MESSAGES, {"role": "assistant", "tool_calls": [{**_OLLAMA_CALL, UNKNOWN: 1}]}]},
        f"messages[1].tool_calls[0].{UNKNOWN}"),
    "messages[].tool_calls[].function": (
        {"messages": [*CHAT_MESSAGES, {"role": "assistant", "tool_calls": [
            {"function": {**_OLLAMA_CALL["function"], UNKNOWN: 1}}]}]},
        f"messages[1].tool_calls[0].function.{UNKNOWN}"),
    "tools[]": ({"tools": [{"type": "function", "function": {"name": "f"}, UNKNOWN: 1}]},
                f"tools[0].{UNKNOWN}"),
    "tools[].function": ({"tools": [{"type": "function", "function": {"name": "f", UNKNOWN: 1}}]},
                         f"tools[0].function.{UNKNOWN}"),
}

#: A body holding an unknown key inside each nested object, and the param the 400 must name.
NESTED: dict[tuple[str, str], tuple[dict[str, Any], str]] = {
    **{(label, "inputs[]"): ({"inputs": [{"content": [{"type": "text", "text": "Hi"}], UNKNOWN: 1}]},
                             f"inputs[0].{UNKNOWN}") for label in COHERE},
    **{(label, "inputs[].content[]"): (
        {"inputs": [{"content": [{"type": "text", "text": "Hi", UNKNOWN: 1}]}]},
        f"inputs[0].content[0].{UNKNOWN}") for label in COHERE},
    **{(label, "structured_outputs"): (
        {**BASE[label][0], "structured_outputs": {"choice": ["a"], UNKNOWN: 1}},
        f"structured_outputs.{UNKNOWN}") for label in ("chat", "completions")},
    **{(label, "documents[]"): ({"query": "What purrs?", "documents": [{"text": "Cats purr.", UNKNOWN: 1}]},
                                f"documents[0].{UNKNOWN}") for label in RERANK},
    ("chat", "messages[]"): ({"messages": [{"role": "user", "content": "Hi", UNKNOWN: 1}]},
                             f"messages[0].{UNKNOWN}"),
    **{(label, "messages[]"): ({"messages": [{"role": "user", "content": "Hi"},
                                             {"role": "assistant", "contnet": "Hello"}]},
                               "messages[1].contnet") for label in ("tokenize", "apply_template")},
    ("chat", "stream_options"): ({"messages": CHAT_MESSAGES, "stream": True,
                                  "stream_options": {"include_usage": True, UNKNOWN: True}},
                                 f"stream_options.{UNKNOWN}"),
    ("completions", "stream_options"): ({"prompt": "Hi", "stream": True, "stream_options": {UNKNOWN: True}},
                                        f"stream_options.{UNKNOWN}"),
    ("chat", "prediction"): (
        {**BASE["chat"][0], "prediction": {"type": "content", "content": "Hi", UNKNOWN: 1}},
        f"prediction.{UNKNOWN}"),
    **{(label, where): ({**BASE[label][0], **body}, param) for label in ANTHROPIC
       for where, (body, param) in _CONVERSATION_OBJECTS.items()},
    ("messages", "metadata"): ({**BASE["messages"][0], "metadata": {"user_id": "u1", UNKNOWN: 1}},
                               f"metadata.{UNKNOWN}"),
    **{("ollama_chat", where): ({**BASE["ollama_chat"][0], **body}, param)
       for where, (body, param) in _OLLAMA_OBJECTS.items()},
    **{(label, "options"): ({**BASE[label][0], "options": {UNKNOWN: 1}}, f"options.{UNKNOWN}")
       for label in OLLAMA},
    **{("responses", where): ({**BASE["responses"][0], **body}, param)
       for where, (body, param) in _RESPONSES_OBJECTS.items()},
    ("message_batches", "requests[]"): (
        {"requests": [{**BASE["message_batches"][0]["requests"][0], UNKNOWN: 1}]}, f"requests[0].{UNKNOWN}"),
    **{(label, where.replace("input", "items", 1)): (
        {**BASE[label][0], "items": body["input"]}, param.replace("input", "items", 1))
       for label in ("conversations", "conversation_items")
       for where, (body, param) in _RESPONSES_OBJECTS.items() if where.startswith("input")},
    ("batches", "output_expires_after"): (
        {**BASE["batches"][0], "output_expires_after": {"anchor": "created_at", "seconds": 3600, UNKNOWN: 1}},
        f"output_expires_after.{UNKNOWN}"),
    ("llama_infill", "input_extra[]"): (
        {**BASE["llama_infill"][0], "input_extra": [{"text": "x", UNKNOWN: 1}]}, f"input_extra[0].{UNKNOWN}"),
}

_ASSISTANT_SAID = {"role": "assistant", "content": "Hello"}
#: A body with each ``refused`` field at a value ruvllm cannot honour, and the param named.
REFUSED: dict[tuple[str, str], tuple[dict[str, Any], str]] = {
    **{(label, field): ({"texts": ["Hi"], field: value}, field) for label in COHERE
       for field, value in (("images", ["data:image/png;base64,iVBORw0K"]), ("output_dimension", 256))},
    **{(label, f"structured_outputs.{field}"): (
        {**BASE[label][0], "structured_outputs": {"json_object": True, field: value}},
        f"structured_outputs.{field}")
       for label in ("chat", "completions") for field, value in (
           ("whitespace_pattern", "[ ]?"), ("structural_tag", '{"type": "structural_tag"}'))},
    **{(label, "relevant_spans"): ({**BASE[label][0], "relevant_spans": {"max_spans": 2}}, "relevant_spans")
       for label in RERANK},
    ("chat", "best_of"): ({"messages": CHAT_MESSAGES, "best_of": 2}, "best_of"),
    ("batches", "completion_window"): ({**BASE["batches"][0], "completion_window": "1h"},
                                       "completion_window"),
    ("completions", "best_of"): ({"prompt": "Hi", "best_of": 2}, "best_of"),
    ("completions", "suffix"): ({"prompt": "def f(x):", "suffix": "    return y"}, "suffix"),
    ("embeddings", "dimensions"): ({"input": "Hi", "dimensions": 8}, "dimensions"),
    ("chat", "service_tier"): ({**BASE["chat"][0], "service_tier": "priority"}, "service_tier"),
    ("chat", "modalities"): ({**BASE["chat"][0], "modalities": ["text", "audio"]}, "modalities"),
    **{(label, "stream_options.include_obfuscation"): (
        {**BASE[label][0], "stream": True, "stream_options": {"include_obfuscation": True}},
        "stream_options.include_obfuscation") for label in ("chat", "completions")},
    **{(label, "messages[].audio"): (
        {"messages": [*CHAT_MESSAGES, {**_ASSISTANT_SAID, "audio": {"id": "audio_abc123"}}]},
        "messages[1].audio") for label in ("chat", "tokenize", "apply_template")},
    **{(label, field): ({**BASE[label][0], **body}, field) for label in ANTHROPIC for field, body in (
        ("thinking.type", {"thinking": {"type": "enabled", "budget_tokens": 1024}}),
        ("thinking.budget_tokens", {"thinking": {"type": "disabled", "budget_tokens": 1024}}),
        ("output_config.effort", {"output_config": {"effort": "high"}}))},
    **{("responses", field): ({**BASE["responses"][0], **body}, field) for field, body in (
        ("truncation", {"truncation": "auto"}),
        ("reasoning.effort", {"reasoning": {"effort": "high"}}),
        ("reasoning.summary", {"reasoning": {"summary": "auto"}}),
        ("reasoning.generate_summary", {"reasoning": {"generate_summary": "auto"}}))},
    **{(label, f"options.{name}"): ({**BASE[label][0], "options": {**BASE[label][0]["options"], **options}},
                                    f"options.{name}")
       for label in OLLAMA for name, options in (
           ("penalize_newline", {"penalize_newline": False, "presence_penalty": 0.5}),
           ("tfs_z", {"tfs_z": 0.5}), ("typical_p", {"typical_p": 0.7}))},
    ("ollama_chat", "messages[].images"): (
        {**BASE["ollama_chat"][0],
         "messages": [{"role": "user", "content": "What is this?", "images": ["iVBORw0K"]}]},
        "messages[0].images"),
    **{("ollama_generate", field): ({**BASE["ollama_generate"][0], field: value}, field) for field, value in (
        ("images", ["iVBORw0K"]), ("suffix", "    return y"), ("template", "{{ .Prompt }}"))},
    **{(label, "options"): ({**BASE[label][0], "options": {"num_ctx": 8}}, "options.num_ctx")
       for label in ("ollama_embed", "ollama_embeddings")},
    ("ollama_embed", "dimensions"): ({**BASE["ollama_embed"][0], "dimensions": 8}, "dimensions"),
    **{(label, field): ({**BASE[label][0], **body}, field) for label in LLAMA for field, body in (
        ("min_keep", {"min_keep": 2}),
        ("post_sampling_probs", {"post_sampling_probs": True}),
        ("lora", {"lora": [{"id": 0, "scale": 1.0}]}))},
}

def _anthropic_accepted(label: str) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each accepted field of Anthropic's bodies: the fields a body holds without it, and with it."""
    cache = {"type": "ephemeral", "ttl": "5m"}
    block = {"type": "text", "text": "Hello"}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "ok"}]}
    call = {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]}
    places = {
        "messages[].content[]": lambda extra: {"messages": [
            *CHAT_MESSAGES, {"role": "assistant", "content": [{**block, **extra}]}, *CHAT_MESSAGES]},
        "messages[].content[].content[]": lambda extra: {"messages": [*CHAT_MESSAGES, call, {
            "role": "user", "content": [{**result, "content": [{"type": "text", "text": "ok", **extra}]}]}]},
        "system[]": lambda extra: {"system": [{"type": "text", "text": "Be brief.", **extra}]},
        "tools[]": lambda extra: {"tools": [{"name": "f", "input_schema": {"type": "object"}, **extra}]},
        "": lambda extra: extra,
    }
    for where, build in places.items():
        dot = f"{where}." if where else ""
        yield f"{dot}cache_control", build({}), build({"cache_control": {"type": "ephemeral"}})
        yield f"{dot}cache_control.type", build({}), build({"cache_control": {"type": "ephemeral"}})
        yield f"{dot}cache_control.ttl", build({"cache_control": {"type": "ephemeral"}}), \
            build({"cache_control": cache})
        if where in ("messages[].content[]", "messages[].content[].content[]", "system[]"):
            yield f"{dot}citations", build({}), build({"citations": []})
    said = {"role": "assistant", "content": [block]}
    thought = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "A greeting.", "signature": ""},
        {"type": "redacted_thinking", "data": "EuYBCkQYAiJA"}, block]}
    for field in ("thinking", "signature", "data"):  # an earlier answer's thinking, dropped
        yield f"messages[].content[].{field}", {"messages": [*CHAT_MESSAGES, said, *CHAT_MESSAGES]}, \
            {"messages": [*CHAT_MESSAGES, thought, *CHAT_MESSAGES]}
    if label == "messages":
        yield "metadata", {}, {"metadata": {}}
        yield "metadata.user_id", {"metadata": {}}, {"metadata": {"user_id": "end-user-7f3a"}}
        yield "service_tier", {}, {"service_tier": "auto"}


def _responses_accepted() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each accepted field of the Responses body: the fields a body holds without it, and with it."""
    yield "user", {}, {"user": "end-user-7f3a"}
    yield "safety_identifier", {}, {"safety_identifier": "end-user-7f3a"}
    yield "prompt_cache_key", {}, {"prompt_cache_key": "tenant-a"}

    def answered(**extra: Any) -> dict[str, Any]:  # an earlier answer sent back as an output item
        said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello",
                                                                     **extra.pop("part", {})}], **extra}
        return {"input": [*CHAT_MESSAGES, said, *CHAT_MESSAGES]}

    yield "input[].status", answered(), answered(status="completed")
    yield "input[].content[].annotations", answered(), answered(part={"annotations": []})
    yield "input[].content[].logprobs", answered(), answered(part={"logprobs": []})
    # An earlier answer's reasoning item, dropped.
    summary = [{"type": "summary_text", "text": "A greeting."}]
    reasoned = answered()
    reasoned["input"].insert(1, {"type": "reasoning", "id": "rs_0123", "summary": summary,
                                 "encrypted_content": "gAAAAABo", "content": [
                                     {"type": "reasoning_text", "text": "A greeting."}]})
    for field in ("summary", "summary[].type", "summary[].text", "encrypted_content"):
        yield f"input[].{field}", answered(), reasoned
    schema = {"type": "json_schema", "name": "greeting",
              "schema": {"type": "object", "properties": {"greeting": {"type": "string"}}}}
    yield "text.format.description", {"text": {"format": schema}}, \
        {"text": {"format": {**schema, "description": "A greeting."}}}
    yield "text.format.strict", {"text": {"format": schema}}, {"text": {"format": {**schema, "strict": True}}}


#: Ollama's options that say how its runner loads and runs a model, with a value each.
_OLLAMA_RUNNER = {"numa": False, "num_batch": 64, "num_gpu": 0, "main_gpu": 0, "low_vram": True,
                  "f16_kv": True, "logits_all": False, "vocab_only": False, "use_mmap": True,
                  "use_mlock": False, "embedding_only": False, "num_thread": 1, "num_keep": 4}


def _ollama_accepted(label: str) -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Each accepted field of Ollama's bodies: the fields a body holds without it, and with it."""
    base = BASE[label][0]
    if label in OLLAMA:
        for name, value in _OLLAMA_RUNNER.items():
            yield f"options.{name}", base, {**base, "options": {**base["options"], name: value}}
    if label == "ollama_chat":
        said = {"role": "assistant", "content": "Hello"}
        yield "messages[].thinking", {"messages": [*CHAT_MESSAGES, said, *CHAT_MESSAGES]}, \
            {"messages": [*CHAT_MESSAGES, {**said, "thinking": "A greeting."}, *CHAT_MESSAGES]}
        call = {**said, "tool_calls": [_OLLAMA_CALL]}
        indexed = {**said, "tool_calls": [{"function": {**_OLLAMA_CALL["function"], "index": 0}}]}
        yield ("messages[].tool_calls[].function.index", {"messages": [*CHAT_MESSAGES, call, *CHAT_MESSAGES]},
               {"messages": [*CHAT_MESSAGES, indexed, *CHAT_MESSAGES]})
    if label == "ollama_show":
        yield "verbose", {}, {"verbose": True}
    if label == "ollama_embed":
        yield "truncate", {}, {"truncate": False}
    if label == "ollama_pull":
        yield "insecure", {}, {"insecure": True}


_CITED = {**_ASSISTANT_SAID, "annotations": [{"type": "url_citation", "url_citation": {
    "start_index": 0, "end_index": 5, "title": "Greetings", "url": "https://example.com/hello"}}]}
#: Each ``accepted`` field: a body without it and the same body with it; the answers must agree.
ACCEPTED: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any]]] = {
    **{(label, "user"): (BASE[label][0], {**BASE[label][0], "user": "end-user-7f3a"})
       for label in ("chat", "completions", "embeddings")},
    **{("chat", field): (BASE["chat"][0], {**BASE["chat"][0], field: value}) for field, value in (
        ("safety_identifier", "end-user-7f3a"),
        ("prompt_cache_key", "faq-v2"))},
    **{(label, "messages[].annotations"): (
        {**BASE["chat"][0], "messages": [*CHAT_MESSAGES, _ASSISTANT_SAID, *CHAT_MESSAGES]},
        {**BASE["chat"][0], "messages": [*CHAT_MESSAGES, _CITED, *CHAT_MESSAGES]})
       for label in ("chat",)},
    **{(label, "messages[].annotations"): ({"messages": [*CHAT_MESSAGES, _ASSISTANT_SAID]},
                                           {"messages": [*CHAT_MESSAGES, _CITED]})
       for label in ("tokenize", "apply_template")},
    ("unload_lora", "lora_int_id"): (BASE["unload_lora"][0], {**BASE["unload_lora"][0], "lora_int_id": 3}),
    **{(label, field): ({**BASE[label][0], **without}, {**BASE[label][0], **with_field})
       for label in ANTHROPIC for field, without, with_field in _anthropic_accepted(label)},
    **{("responses", field): ({**BASE["responses"][0], **without}, {**BASE["responses"][0], **with_field})
       for field, without, with_field in _responses_accepted()},
    **{(label, field): ({**BASE[label][0], **without}, {**BASE[label][0], **with_field})
       for label in (*OLLAMA, "ollama_show", "ollama_embed", "ollama_embeddings", "ollama_pull")
       for field, without, with_field in _ollama_accepted(label)},
    **{(label, field): (BASE[label][0], {**BASE[label][0], field: value}) for label in LLAMA
       for field, value in (("cache_prompt", False), ("id_slot", 0), ("t_max_prompt_ms", 500),
                            ("n_keep", -1))},
    **{(label, f"structured_outputs.{field}"): (
        {**BASE[label][0], "structured_outputs": {"choice": ["yes", "no"]}},
        {**BASE[label][0], "structured_outputs": {"choice": ["yes", "no"], field: True}})
       for label in ("chat", "completions")
       for field in ("disable_any_whitespace", "disable_additional_properties", "disable_fallback")},
    **{(label, "priority"): (BASE[label][0], {**BASE[label][0], "priority": 5})
       for label in ("score", "score_v1", *RERANK)},
    **{(label, "raw_scores"): (BASE[label][0], {**BASE[label][0], "raw_scores": True}) for label in RERANK},
    **{(label, field): (BASE[label][0], {**BASE[label][0], field: value}) for label in COHERE
       for field, value in (("input_type", "search_query"), ("priority", 3))},
}


def send(server: RunningServer, label: str, body: dict[str, Any]) -> httpx.Response:
    method, path = ENDPOINTS[label]
    if method == "GET":
        return httpx.get(server.url + path, params=body, headers=AUTH, timeout=120)
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def _error(r: httpx.Response) -> dict[str, Any]:
    """The 400's error, with a ``param``: Anthropic's shape has none, its message starts with
    the field's path instead."""
    assert r.status_code == 400, (r.status_code, r.text)
    body = r.json()
    if isinstance(body.get("error"), str):  # Ollama's shape
        return {"message": body["error"], "param": body["error"].split(":", 1)[0]}
    if body.get("type") == "error":  # Anthropic's shape
        error = body["error"]
        assert error["type"] == "invalid_request_error" and set(error) == {"type", "message"}, body
        return {**error, "param": error["message"].split(":", 1)[0]}
    return body["error"]


def test_every_endpoint_and_nested_object_has_a_request_here(routes):
    """A new endpoint, or a new object inside a body, fails until it is tried below."""
    assert set(BASE) == set(ENDPOINTS)
    by_route = {route: label for label, route in ENDPOINTS.items()}
    nested = {(by_route[route], where) for route, (_, models) in routes.items() for where in models if where}
    assert set(NESTED) == nested
    assert set(REFUSED) == {key for key, kind in TABLE.items() if kind == "refused"}
    assert set(ACCEPTED) == {key for key, kind in TABLE.items() if kind == "accepted"}


@pytest.mark.parametrize("label", list(ENDPOINTS))
def test_an_unknown_field_is_a_400_naming_it(server, label):
    body, status = BASE[label]
    assert send(server, label, body).status_code == status  # the body alone is not what is refused
    error = _error(send(server, label, {**body, UNKNOWN: 1}))
    assert error["param"] == UNKNOWN and UNKNOWN in error["message"], error


@pytest.mark.parametrize("label", list(ENDPOINTS))
def test_every_unknown_field_is_named_in_one_400(server, label):
    error = _error(send(server, label, {**BASE[label][0], "zz_second": 2, "aa_first": 1}))
    assert error["param"] == "aa_first" and "zz_second" in error["message"], error


@pytest.mark.parametrize("key", sorted(NESTED))
def test_an_unknown_field_inside_an_object_is_a_400_naming_its_path(server, key):
    body, param = NESTED[key]
    error = _error(send(server, key[0], body))
    assert error["param"] == param and param in error["message"], error


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_a_refused_value_is_a_400_naming_the_field(server, key):
    body, param = REFUSED[key]
    error = _error(send(server, key[0], body))
    assert error["param"] == param, error


def _answer(label: str, r: httpx.Response) -> Any:
    """What a client gets, without what differs between any two requests (ids, timestamps, and
    how much of the prompt an earlier request left in the prefix cache)."""
    if not r.headers.get("content-type", "").startswith("application/json"):
        return r.status_code, r.text
    data = r.json()
    if isinstance(data, dict) and isinstance(data.get("usage"), dict):
        counts = data["usage"]
        if "cache_read_input_tokens" in counts:  # Anthropic's: the prompt is input plus cache reads
            counts = {"prompt": counts["input_tokens"] + counts["cache_read_input_tokens"],
                      "output_tokens": counts["output_tokens"]}
        data["usage"] = {k: v for k, v in counts.items() if k not in ("prompt_tokens_details",
                                                                      "input_tokens_details")}
    if label == "embeddings" and r.status_code == 200:
        return data["usage"], np.array([d["embedding"] for d in data["data"]], dtype=np.float64)
    if label in ("ollama_embed", "ollama_embeddings") and r.status_code == 200:
        return data.get("prompt_eval_count"), np.array(data.get("embeddings") or [data["embedding"]])
    if label.startswith("ollama_") and r.status_code == 200:  # without the answer's timestamp and timings
        return {k: v for k, v in data.items() if k != "created_at" and not k.endswith("_duration")}
    if label in LLAMA and r.status_code == 200:  # without the answer's timings
        return {k: v for k, v in data.items() if k not in ("timings", "tokens_cached")}
    if label == "responses" and r.status_code == 200:
        # The answer, not the request's settings echoed around it (they repeat the field sent).
        output = [{k: v for k, v in item.items() if k != "id"} for item in data["output"]]
        return data["status"], data["incomplete_details"], output, data["usage"]
    return r.status_code, {k: v for k, v in data.items() if k not in ("id", "created")}


@pytest.fixture(scope="module")
def answered() -> dict[str, httpx.Response]:
    """Responses to the bodies without a field, by endpoint and body: many accepted fields share
    one (the endpoint's base body), and the server answers it the same every time (greedy, no
    sampling), so it is sent once."""
    return {}


@pytest.mark.parametrize("key", sorted(ACCEPTED))
def test_an_accepted_field_leaves_the_answer_as_it_is(server, answered, key):
    label = key[0]
    body, body_with_field = ACCEPTED[key]
    cache_key = f"{label} {json.dumps(body, sort_keys=True)}"
    if cache_key not in answered:
        answered[cache_key] = send(server, label, body)
    without, with_field = answered[cache_key], send(server, label, body_with_field)
    assert without.status_code == with_field.status_code == BASE[label][1], with_field.text
    a, b = _answer(label, without), _answer(label, with_field)
    if label in ("embeddings", "ollama_embed", "ollama_embeddings"):
        assert a[0] == b[0]
        assert float(np.sum(a[1] * b[1])) > 0.9999  # unit vectors: cosine; the kernels' rounding aside
    else:
        assert a == b


# --- decisions the table states beyond a field's presence ---------------------------------------

def test_include_obfuscation_false_is_what_ruvllm_does(server):
    r = send(server, "completions", {**BASE["completions"][0], "stream": True,
                                     "stream_options": {"include_obfuscation": False, "include_usage": True}})
    assert r.status_code == 200, r.text
    assert "obfuscation" not in r.text and '"usage"' in r.text


def test_a_refusal_is_rendered_as_the_assistant_turn(server):
    """OpenAI answers a refused request with ``refusal`` in place of ``content``; replayed as
    history it is that turn's text, the same tokens as sending it as content."""
    said = "I cannot help with that."
    refused = {"role": "assistant", "content": None, "refusal": said}
    as_refusal = send(server, "tokenize", {"messages": [*CHAT_MESSAGES, refused]})
    said_it = {"role": "assistant", "content": said}
    as_content = send(server, "tokenize", {"messages": [*CHAT_MESSAGES, said_it]})
    assert as_refusal.status_code == 200, as_refusal.text
    assert as_refusal.json()["tokens"] == as_content.json()["tokens"]
    both = send(server, "chat", {"messages": [*CHAT_MESSAGES, {"role": "assistant", "content": "Sure.",
                                                                "refusal": said}, *CHAT_MESSAGES]})
    assert _error(both)["param"] == "messages[1].refusal"
    on_user = send(server, "tokenize", {"messages": [{"role": "user", "content": None, "refusal": said}]})
    assert _error(on_user)["param"] == "messages[0].refusal"


def test_a_text_part_with_another_key_is_a_400_naming_it(server):
    part = {"type": "text", "text": "Say hello.", "cache_control": {"type": "ephemeral"}}
    error = _error(send(server, "chat", {"messages": [{"role": "user", "content": [part]}]}))
    assert error["param"] == "messages[0].content[0].cache_control", error


def test_name_reaches_the_chat_template():
    """Honoured as vLLM honours it: handed to the template, which renders it where it has a place
    for it (``tool_call_id`` and ``tool_calls``: tests/server/test_tool_call_turns.py)."""
    from ruvllm.chat import render_chat
    from ruvllm.server.http.chat_messages import ChatMessage, message_dicts

    messages = message_dicts([ChatMessage(role="user", content="Say hello.", name="ada")])
    assert render_chat("{% for m in messages %}{{ m.name }}: {{ m.content }}{% endfor %}", messages) == \
        "ada: Say hello."


def test_add_special_tokens_with_messages_only_false(server):
    """With messages the template places the special tokens: false (vLLM's default for chat) is
    what is done anyway, true is refused rather than ignored."""
    messages = {"messages": CHAT_MESSAGES}
    default = send(server, "tokenize", messages)
    false = send(server, "tokenize", {**messages, "add_special_tokens": False})
    assert default.status_code == false.status_code == 200
    assert default.json()["tokens"] == false.json()["tokens"]
    error = _error(send(server, "tokenize", {**messages, "add_special_tokens": True}))
    assert error["param"] == "add_special_tokens", error


def test_refuse_unknown_query_names_the_parameter():
    from ruvllm.errors import InvalidRequest
    from ruvllm.server.http.strict_fields import refuse_unknown_query

    refuse_unknown_query({"model": "x"}, {"model"}, "/tokenizer_info")
    with pytest.raises(InvalidRequest) as err:
        refuse_unknown_query({"model": "x", "modle": "y", "bos": "1"}, {"model"}, "/tokenizer_info")
    assert err.value.field == "bos" and "modle" in str(err.value) and "takes only model" in str(err.value)


def test_request_bodies_share_one_base():
    """The bodies this server's own modules declare refuse unknown fields through one base."""
    from ruvllm.server.extensions.tokenize import DetokenizeRequest, TokenizeRequest
    from ruvllm.server.openai.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
    for model in (ChatCompletionRequest, CompletionRequest, EmbeddingRequest, TokenizeRequest,
                  DetokenizeRequest):
        assert issubclass(model, RequestBody), model
