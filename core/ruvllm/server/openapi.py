"""The published ``/openapi.json`` completed with this server's own limits.

The request models state the fixed ranges (temperature, top_p, penalties, logprobs...); the
bounds an operator sets (``max_n``, ``max_tokens``) and the model's vocabulary are only known
when the app is built, so they are written into the generated schema here. A schema-driven
client (or test) then sees the constraints the server enforces instead of finding them by 400s.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from ruvllm.server.lifecycle.params import Limits


def _int_branch(prop: dict[str, Any]) -> dict[str, Any]:
    """The integer schema of ``int`` or ``int | None`` (pydantic writes the latter as anyOf)."""
    for branch in prop.get("anyOf", [prop]):
        if branch.get("type") == "integer":
            return branch
    raise KeyError("no integer branch")


def _token_ids(node: Any, vocab_size: int) -> None:
    """Bound every token id (an integer with minimum 0) under ``node`` by the vocabulary, and
    close every map whose keys have a pattern (``logit_bias``: other keys are refused)."""
    if isinstance(node, dict):
        if node.get("type") == "integer" and node.get("minimum") == 0:
            node["maximum"] = vocab_size - 1
        if "patternProperties" in node:
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _token_ids(value, vocab_size)
    elif isinstance(node, list):
        for value in node:
            _token_ids(value, vocab_size)


def _requires(field: str, value: Any, needs: str, needed: Any) -> dict[str, Any]:
    """JSON Schema for "when ``field`` is ``value``, ``needs`` must be ``needed``"."""
    return {"if": {"properties": {field: {"const": value}}, "required": [field]},
            "then": {"properties": {needs: {"const": needed}}, "required": [needs]}}


_STREAM_OPTIONS_NEED_STREAM = {
    "if": {"not": {"properties": {"stream": {"const": True}}, "required": ["stream"]}},
    "then": {"properties": {"stream_options": {"type": "null"}}},
}
#: Rules between fields that params.py enforces, per request model.
_CROSS_FIELD = {
    "ChatCompletionRequest": [{
        "if": {"properties": {"top_logprobs": {"type": "integer"}}, "required": ["top_logprobs"]},
        "then": {"properties": {"logprobs": {"const": True}}, "required": ["logprobs"]}}],
    "CompletionRequest": [_requires("max_tokens", 0, "echo", True)],
}


def with_limits(schema: dict[str, Any], limits: Limits, vocab_size: int | None, *,
                models: list[str] | None = None, priority_scheduling: bool = True) -> dict[str, Any]:
    """``schema`` with the server's bounds: ``max_n``, ``max_tokens``, the vocabulary for token
    ids, the served model names, ``priority`` fixed at 0 unless the engine schedules by priority,
    and the rules between fields (``stream_options`` needs ``stream``...). ``vocab_size`` None
    (several models, each its own vocabulary) and ``models`` None (names that change at runtime)
    leave those open."""
    components = schema.get("components", {}).get("schemas", {})
    for name in ("ChatCompletionRequest", "CompletionRequest"):
        model_schema = components.get(name, {})
        props = model_schema.get("properties")
        if not props:
            continue
        rules = [_STREAM_OPTIONS_NEED_STREAM, *_CROSS_FIELD[name]]
        model_schema["allOf"] = [*model_schema.get("allOf", []), *rules]
        if models:
            props["model"] = {"anyOf": [{"enum": models}, {"type": "null"}], "title": "Model"}
        if not priority_scheduling:
            props["priority"] = {"const": 0, "default": 0, "title": "Priority",
                                 "description": "only 0: this server does not schedule by priority"}
        props["n"]["maximum"] = limits.max_n
        for field in ("max_tokens", "max_completion_tokens"):
            if field in props:
                _int_branch(props[field])["maximum"] = limits.max_tokens
        for field in ("stop_token_ids", "prompt", "logit_bias"):
            if field in props and vocab_size is not None:
                _token_ids(props[field], vocab_size)
    return schema


def install_openapi_limits(app: FastAPI, limits: Limits, vocab_size: int | None, *, models: list[str] | None,
                           priority_scheduling: bool) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = with_limits(generate(), limits, vocab_size, models=models,
                                             priority_scheduling=priority_scheduling)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
