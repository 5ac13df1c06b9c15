"""Tool calling: the request's tools checked, enforced calls as a grammar, the model's calls parsed.

``tool_choice`` decides who shapes the output:

- ``required`` and a named function are ENFORCED: the output is generated under a JSON grammar
  that only admits a list of calls to the allowed functions, each ``arguments`` valid against
  that function's ``parameters`` schema. ruvllm reads the list back, so the format is ruvllm's
  own (``[{"name": ..., "arguments": {...}}]``) whatever the model's native one is.
- ``auto`` leaves the model free and parses its own format afterwards (Hermes/Qwen
  ``<tool_call>{...}</tool_call>``, Mistral ``[TOOL_CALLS][...]``, Llama 3.1 JSON
  ``{"name": ..., "parameters": ...}``), found from its chat template. A template that does not
  render ``tools`` at all gives the model no way to know them: ``auto`` is then plain text.
- ``none`` (or no tools) is plain text.

``parallel_tool_calls: false`` allows one call: enforced modes have it in their grammar; under
``auto`` the model may still write several, and only the first is returned (what vLLM does:
the model's own format cannot be constrained without rewriting it).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ruvllm.errors import InvalidRequest
from ruvllm.guided.grammar import GrammarSpec, json_schema_grammar

_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")


@attrs.frozen
class Tool:
    name: str
    parameters: Mapping[str, Any]
    description: str | None = None


@attrs.frozen
class ToolCall:
    name: str
    #: The arguments as a JSON string (OpenAI's shape).
    arguments: str
    id: str = attrs.field(factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def openai(self, index: int | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "type": "function",
                               "function": {"name": self.name, "arguments": self.arguments}}
        if index is not None:
            out["index"] = index
        return out


@attrs.frozen
class ToolPlan:
    """What one chat request does with its tools."""

    #: ``none``, ``auto``, ``required`` or ``named``.
    mode: str
    tools: tuple[Tool, ...] = ()
    #: The tools to render into the prompt (OpenAI's dicts, as transformers passes them).
    rendered: tuple[dict[str, Any], ...] | None = None
    #: Enforced modes: the grammar of the calls.
    grammar: GrammarSpec | None = None
    #: ``auto``: the model's own format (``hermes``, ``mistral``, ``llama3``, ``generic``).
    parser: str | None = None
    #: How many calls one answer may hold (None: any; 1 with ``parallel_tool_calls: false``
    #: and for a named function).
    max_calls: int | None = None

    @property
    def enforced(self) -> bool:
        return self.mode in ("required", "named")

    @property
    def parses_output(self) -> bool:
        return self.enforced or (self.mode == "auto" and self.parser is not None)


def parse_tools(tools: Sequence[Any]) -> tuple[Tool, ...]:
    out = []
    seen: set[str] = set()
    for i, t in enumerate(tools):
        field = f"tools[{i}]"
        if not isinstance(t, Mapping) or t.get("type", "function") != "function":
            raise InvalidRequest(f"{field}.type", "only {\"type\": \"function\"} tools are supported")
        fn = t.get("function")
        if not isinstance(fn, Mapping):
            raise InvalidRequest(f"{field}.function", "is required: {\"name\": ..., \"parameters\": {...}}")
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.match(name):
            raise InvalidRequest(f"{field}.function.name",
                                 f"must be 1-64 letters, digits, '_', '.' or '-'; got {name!r}")
        if name in seen:
            raise InvalidRequest(f"{field}.function.name", f"{name!r} is defined twice")
        seen.add(name)
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        if not isinstance(params, Mapping):
            raise InvalidRequest(f"{field}.function.parameters", "must be a JSON schema object")
        out.append(Tool(name, params, fn.get("description")))
    return tuple(out)


def detect_parser(chat_template: str | None) -> str | None:
    """The tool-call format the model's template teaches it, or None when it renders no tools."""
    if not chat_template or "tools" not in chat_template:
        return None
    if "<tool_call>" in chat_template:
        return "hermes"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|python_tag|>" in chat_template or "ipython" in chat_template:
        return "llama3"
    return "generic"


def calls_schema(tools: Sequence[Tool], *, max_calls: int | None) -> dict[str, Any]:
    """JSON schema of a list of calls to ``tools`` (ruvllm's enforced-call format)."""
    one_of = [{"type": "object",
               "properties": {"name": {"const": t.name}, "arguments": dict(t.parameters)},
               "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    item = one_of[0] if len(one_of) == 1 else {"anyOf": one_of}
    schema: dict[str, Any] = {"type": "array", "items": item, "minItems": 1}
    if max_calls is not None:
        schema["maxItems"] = max_calls
    return schema


def plan_tools(tools: Sequence[Any] | None, tool_choice: Any, parallel_tool_calls: bool | None,
               chat_template: str | None) -> ToolPlan:
    """Check ``tools`` / ``tool_choice`` / ``parallel_tool_calls`` and decide how to serve them."""
    if not tools:
        if tool_choice not in (None, "none", "auto"):
            raise InvalidRequest("tool_choice", "needs tools")
        return ToolPlan("none")
    parsed = parse_tools(tools)
    parallel = True if parallel_tool_calls is None else bool(parallel_tool_calls)
    rendered = tuple(dict(t) for t in tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolPlan("none", parsed, rendered)
    if choice == "auto":
        return ToolPlan("auto", parsed, rendered, parser=detect_parser(chat_template),
                        max_calls=None if parallel else 1)
    if choice == "required":
        allowed = parsed
        mode = "required"
    elif isinstance(choice, Mapping) and isinstance(choice.get("function"), Mapping):
        name = choice["function"].get("name")
        allowed = tuple(t for t in parsed if t.name == name)
        if not allowed:
            raise InvalidRequest("tool_choice.function.name",
                                 f"{name!r} is not among the tools ({', '.join(t.name for t in parsed)})")
        mode = "named"
    else:
        raise InvalidRequest("tool_choice", "must be none, auto, required or "
                             "{\"type\": \"function\", \"function\": {\"name\": ...}}; "
                             f"got {choice!r}")
    max_calls = None if parallel and mode == "required" else 1
    grammar = json_schema_grammar("tools", calls_schema(allowed, max_calls=max_calls),
                                  kind=f"tool_choice {mode}")
    return ToolPlan(mode, parsed, rendered, grammar=grammar, max_calls=max_calls)


def _call(name: Any, arguments: Any) -> ToolCall | None:
    if not isinstance(name, str):
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    if arguments is None:
        arguments = {}
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False))


def _json_objects(text: str) -> list[Any]:
    """Every top-level JSON value found in ``text`` in order (non-JSON text between them skipped)."""
    decoder = json.JSONDecoder()
    out, i = [], 0
    while i < len(text):
        j = min((k for k in (text.find("{", i), text.find("[", i)) if k >= 0), default=-1)
        if j < 0:
            break
        try:
            value, end = decoder.raw_decode(text, j)
        except json.JSONDecodeError:
            i = j + 1
            continue
        out.append(value)
        i = end
    return out


def _calls_from_values(values: Sequence[Any], names: set[str]) -> list[ToolCall]:
    calls = []
    for value in values:
        items = value if isinstance(value, list) else [value]
        for item in items:
            if not isinstance(item, Mapping) or item.get("name") not in names:
                continue
            call = _call(item.get("name"), item.get("arguments", item.get("parameters")))
            if call is not None:
                calls.append(call)
    return calls


#: Where the model's own tool-call text starts, per format (None: the whole output is tried).
MARKERS = {"hermes": "<tool_call>", "mistral": "[TOOL_CALLS]", "llama3": None, "generic": None}


def split_tool_calls(text: str, plan: ToolPlan) -> tuple[str, list[ToolCall]]:
    """``(content, calls)`` from a finished output: content is the text before the calls, and
    the calls beyond ``plan.max_calls`` are dropped."""
    content, calls = _split(text, plan)
    return content, calls[:plan.max_calls]


def _split(text: str, plan: ToolPlan) -> tuple[str, list[ToolCall]]:
    names = {t.name for t in plan.tools}
    if plan.enforced:
        values = _json_objects(text)
        calls = _calls_from_values(values[:1], names)
        return ("", calls) if calls else (text, [])
    marker = MARKERS.get(plan.parser or "")
    if plan.parser == "hermes":
        start = text.find("<tool_call>")
        if start < 0:
            return text, []
        blocks = re.findall(r"<tool_call>(.*?)(?:</tool_call>|$)", text[start:], flags=re.S)
        calls = _calls_from_values([v for b in blocks for v in _json_objects(b)], names)
        return (text[:start].rstrip(), calls) if calls else (text, [])
    if marker is not None:
        start = text.find(marker)
        if start < 0:
            return text, []
        calls = _calls_from_values(_json_objects(text[start + len(marker):]), names)
        return (text[:start].rstrip(), calls) if calls else (text, [])
    body = text.replace("<|python_tag|>", "")
    stripped = body.strip()
    if not stripped.startswith(("{", "[")):
        return text, []
    calls = _calls_from_values(_json_objects(stripped), names)
    return ("", calls) if calls else (text, [])


def hold_back(text: str, plan: ToolPlan) -> int:
    """How many characters at the end of streamed ``text`` must wait: they may start the
    model's tool-call syntax. Returns ``len(text)`` once a call has started (all text held).

    Whitespace just before a (possible) call waits too: :func:`split_tool_calls` strips it from
    the content, and the streamed content must add up to the same text as the whole answer's."""
    if plan.enforced:
        return len(text)
    marker = MARKERS.get(plan.parser or "")
    if marker is None:
        # JSON-style formats: a call is the whole output; hold text that starts like one.
        stripped = text.lstrip()
        if not stripped or stripped.startswith(("{", "[", "<|python_tag|>")) \
                or "<|python_tag|>".startswith(stripped):
            return len(text)
        return 0
    start = text.find(marker)
    if start < 0:
        start = next((len(text) - k for k in range(min(len(marker) - 1, len(text)), 0, -1)
                      if text.endswith(marker[:k])), len(text))
    return len(text) - len(text[:start].rstrip())
