"""The published /openapi.json states what the server enforces (issue 14), and unknown request
fields are refused by name.

Bodies are generated from the served schema itself (a hypothesis strategy per JSON Schema node:
hypothesis-jsonschema 0.23 does not work with the pinned hypothesis): every body the schema
allows must be answered 200, and a value just outside a range the schema states must be
refused by the schema (jsonschema) and by the server (400 naming the field). The prompt and the
messages are fixed; free-form fields other features own (tools, guided_*, response_format) and
streaming are left out of the generated part.
"""

from __future__ import annotations

import copy
import uuid

import httpx
import jsonschema
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_helpers import API_KEY, RunningServer, start_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
#: Request fields the generated bodies vary (the sampling and limit fields the schema bounds).
VARIED = ["model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "n", "stop", "seed",
          "presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty", "ignore_eos",
          "stop_token_ids", "priority", "cache_salt", "logprobs", "top_logprobs", "echo", "user"]
FIXED = {"CompletionRequest": {"prompt": "One, two,"},
         "ChatCompletionRequest": {"messages": [{"role": "user", "content": "Hi"}]}}
PATHS = {"CompletionRequest": "/v1/completions", "ChatCompletionRequest": "/v1/chat/completions"}


@pytest.fixture(scope="module")
def small_server() -> RunningServer:
    running = start_server(server={"max_tokens_limit": 3, "max_n": 2})
    yield running
    running.stop()


@pytest.fixture(scope="module")
def openapi(small_server) -> dict:
    return httpx.get(small_server.url + "/openapi.json", headers=HEADERS, timeout=30).json()


def _validator(openapi: dict, name: str) -> jsonschema.Validator:
    root = {"$ref": f"#/components/schemas/{name}", "components": openapi["components"]}
    return jsonschema.Draft202012Validator(root)


def from_schema(node: dict) -> st.SearchStrategy:
    """Values valid under ``node``, for the JSON Schema keywords the request models use."""
    if "anyOf" in node:
        return st.one_of([from_schema(branch) for branch in node["anyOf"]])
    if "const" in node:
        return st.just(node["const"])
    if "enum" in node:
        return st.sampled_from(node["enum"])
    kind = node.get("type")
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        low, high = node.get("minimum"), node.get("maximum")
        return st.integers(None if low is None else int(low), None if high is None else int(high))
    if kind == "number":
        low = node.get("minimum", node.get("exclusiveMinimum"))
        return st.floats(low, node.get("maximum", node.get("exclusiveMaximum")), allow_nan=False,
                         allow_infinity=False, exclude_min="exclusiveMinimum" in node,
                         exclude_max="exclusiveMaximum" in node)
    if kind == "string":
        if "pattern" in node:
            return st.from_regex(node["pattern"], fullmatch=True)
        return st.text(min_size=node.get("minLength", 0), max_size=12)
    if kind == "array":
        return st.lists(from_schema(node.get("items", {})), min_size=node.get("minItems", 0), max_size=4)
    if kind == "object":
        if "patternProperties" in node:
            (pattern, values), = node["patternProperties"].items()
            return st.dictionaries(st.from_regex(pattern, fullmatch=True), from_schema(values), max_size=3)
        values = node.get("additionalProperties")
        if isinstance(values, dict):
            keys = node.get("propertyNames", {"type": "string"})
            return st.dictionaries(from_schema(keys), from_schema(values), max_size=3)
        props = node.get("properties", {})
        return st.fixed_dictionaries({}, optional={k: from_schema(v) for k, v in props.items()})
    raise AssertionError(f"the request schema uses a construct this test cannot generate: {node}")


def _varied_schema(openapi: dict, name: str) -> dict:
    """The model's schema restricted to VARIED (keeping its rules between those fields)."""
    full = copy.deepcopy(openapi["components"]["schemas"][name])
    props = {k: v for k, v in full["properties"].items() if k in VARIED}
    rules = [r for r in full.get("allOf", []) if "stream_options" not in str(r)]
    return {"type": "object", "properties": props, "additionalProperties": False, "allOf": rules}


def test_schema_states_the_servers_limits(openapi, small_server):
    comp = openapi["components"]["schemas"]["CompletionRequest"]
    chat = openapi["components"]["schemas"]["ChatCompletionRequest"]
    assert comp["additionalProperties"] is False and chat["additionalProperties"] is False
    assert comp["properties"]["n"]["maximum"] == 2
    assert {"type": "integer", "minimum": 1, "maximum": 3} in [
        {k: v for k, v in b.items() if k != "title"} for b in chat["properties"]["max_tokens"]["anyOf"]]
    temp = next(b for b in comp["properties"]["temperature"]["anyOf"] if b.get("type") == "number")
    assert (temp["minimum"], temp["maximum"]) == (0, 2)
    assert comp["properties"]["priority"]["const"] == 0  # the test server schedules first come, first served
    assert "messages" in chat["required"] and "prompt" in comp["required"]


@pytest.mark.parametrize("name", ["CompletionRequest", "ChatCompletionRequest"])
def test_generated_bodies_are_accepted(openapi, small_server, name):
    varied = _varied_schema(openapi, name)
    rules = jsonschema.Draft202012Validator({"allOf": varied["allOf"]})
    # The rules between fields (max_tokens 0 needs echo...) are met by filtering.
    strategy = from_schema(varied).filter(rules.is_valid)
    validator = _validator(openapi, name)
    statuses = []

    @settings(max_examples=12, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
    @given(strategy)
    def check(varied):
        body = {**FIXED[name], **varied}
        validator.validate(body)  # the generated body is valid under the full schema
        r = httpx.post(small_server.url + PATHS[name], json=body, headers=HEADERS, timeout=120)
        statuses.append(r.status_code)
        assert r.status_code == 200, (body, r.text)

    check()
    assert statuses


#: A value just outside each stated range, and the field the server must name.
OUT_OF_RANGE = [
    ("temperature", 2.01), ("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("n", 0), ("n", 3),
    ("max_tokens", 4), ("presence_penalty", 2.5), ("frequency_penalty", -2.5), ("top_k", -1),
    ("min_p", 1.5), ("repetition_penalty", 0.0), ("seed", -1), ("priority", 1), ("cache_salt", ""),
    ("logit_bias", {"5": 100.5}), ("logit_bias", {"x": 1.0}), ("stop", [""]), ("stop_token_ids", [-1]),
]


@pytest.mark.parametrize(("field", "value"), OUT_OF_RANGE)
def test_out_of_range_is_refused_by_schema_and_server(openapi, small_server, field, value):
    body = {"prompt": "One, two,", field: value}
    with pytest.raises(jsonschema.ValidationError):
        _validator(openapi, "CompletionRequest").validate(body)
    r = httpx.post(small_server.url + "/v1/completions", json=body, headers=HEADERS, timeout=60)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"].startswith(field), r.json()


def test_cross_field_rules_in_schema_and_server(openapi, small_server):
    for name, body in [("CompletionRequest", {"prompt": "x", "max_tokens": 0}),
                       ("ChatCompletionRequest", {"messages": [{"role": "user", "content": "x"}],
                                                  "top_logprobs": 2}),
                       ("CompletionRequest", {"prompt": "x", "stream_options": {"include_usage": True}})]:
        with pytest.raises(jsonschema.ValidationError):
            _validator(openapi, name).validate(body)
        r = httpx.post(small_server.url + PATHS[name], json=body, headers=HEADERS, timeout=60)
        assert r.status_code == 400, r.text


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_unknown_fields_are_refused_by_name(small_server, path):
    body = {"prompt": "x"} if path == "/v1/completions" else {"messages": [{"role": "user", "content": "x"}]}
    r = httpx.post(small_server.url + path, json={**body, "return_tokens_as_ids": True, "guided_jsn": {}},
                   headers=HEADERS, timeout=60)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "guided_jsn"
    assert "guided_jsn" in err["message"] and "return_tokens_as_ids" in err["message"]


def test_cache_salt_keeps_cached_prefixes_apart(small_server):
    """Requests share cached prefix KV only under the same salt: the second request of a salt
    reads the first's prompt from the prefix cache, another salt's reads none of it."""
    prompt = f"Request {uuid.uuid4().hex}: count from one to twenty in words, one per line, and stop."

    def cached(salt: str) -> int:
        r = httpx.post(small_server.url + "/v1/completions", headers=HEADERS, timeout=60,
                       json={"prompt": prompt, "max_tokens": 1, "temperature": 0, "cache_salt": salt})
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("tenant-a") == 0
    assert cached("tenant-a") >= 16  # at least one whole block (16 tokens) of the prompt
    assert cached("tenant-b") == 0


def test_priority_keeps_vllms_meaning():
    from types import SimpleNamespace

    from ruvllm.errors import InvalidRequest
    from ruvllm.server.lifecycle.scheduling import submit_options

    engine = SimpleNamespace(scheduling_policy="priority")
    # vLLM: a lower priority is served earlier; the engine's scale is the opposite.
    assert submit_options(-3, "s", engine) == {"priority": 3, "cache_salt": "s"}
    with pytest.raises(InvalidRequest, match="schedules by fcfs"):
        submit_options(1, None, SimpleNamespace(scheduling_policy="fcfs"))
