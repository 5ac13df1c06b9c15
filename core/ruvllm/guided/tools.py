"""Tool calling: the request's tools checked, enforced calls as a grammar, the model's calls parsed.

``tool_choice`` decides who shapes the output:

- ``required`` and a named function are ENFORCED: the output is generated under a JSON grammar
  that only admits a list of calls to the allowed functions, each ``arguments`` valid against
  that function's ``parameters`` schema. ruvllm reads the list back, so the format is ruvllm's
  own (``[{"name": ..., "arguments": {...}}]``) whatever the model's native one is.
- ``auto`` leaves the model free and parses its own format afterwards (Hermes/Qwen
  ``<tool_call>{...}</tool_call>``, Mistral ``[TOOL_CALLS][...]``, Llama 3.1 JSON
  ``{"name": ..., "parameters": ...}``), found from its chat template.
- A template that does not render ``tools`` (the embedded SmolLM2's) would leave the model
  unaware of them, and ``auto`` silently plain text. Such a model gets the tools and the calling
  convention in a system message (:attr:`ToolPlan.instructions`), and under ``auto`` its answer
  is constrained to one JSON object, a reply or calls: ``{"response": "..."}`` or
  ``{"tool_calls": [{"name": ..., "arguments": {...}}]}`` (the ``reply_or_call`` format, as
  llama-server's generic format), with one call per answer unless ``parallel_tool_calls`` is
  true. The reply streams as it is decoded.
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
    """A call the model's answer makes: the tool's name and its arguments as the JSON value the
    model wrote (an object), so that an API whose calls carry an object (Anthropic's ``input``,
    Ollama's ``arguments``) never decodes a string; an API that sends a JSON string (OpenAI's)
    encodes it as it writes the call."""

    name: str
    arguments: Any
    id: str = attrs.field(factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


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
    #: ``auto``: the model's own format (``hermes``, ``mistral``, ``llama3``, ``generic``), or
    #: ``reply_or_call`` where its template renders no tools.
    parser: str | None = None
    #: How many calls one answer may hold (None: any; 1 with ``parallel_tool_calls: false``
    #: and for a named function).
    max_calls: int | None = None
    #: System text that teaches the tools to a model whose template cannot render them.
    instructions: str | None = None

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


#: The format of a model whose chat template renders no tools (see the module docstring).
REPLY_OR_CALL = "reply_or_call"


def tool_format(chat_template: str | None) -> str:
    """How a model with this template is served tools under ``auto`` (``/v1/models`` says it)."""
    return detect_parser(chat_template) or REPLY_OR_CALL


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


def reply_or_call_schema(tools: Sequence[Tool], *, max_calls: int | None) -> dict[str, Any]:
    """JSON schema of an ``auto`` answer in the ``reply_or_call`` format. A reply says something:
    ``{"response": ""}`` would reach the client as an answer with neither text nor a call (the
    embedded model sampled it, 6 tokens, one answer in 20 at temperature 0.8)."""
    reply = {"type": "object", "properties": {"response": {"type": "string", "minLength": 1}},
             "required": ["response"], "additionalProperties": False}
    calls = {"type": "object", "properties": {"tool_calls": calls_schema(tools, max_calls=max_calls)},
             "required": ["tool_calls"], "additionalProperties": False}
    return {"anyOf": [reply, calls]}


def instructions(tools: Sequence[Tool], mode: str, max_calls: int | None) -> str:
    """The system text that describes ``tools`` and how to call them, for a template that
    cannot render them."""
    listed = json.dumps([{"name": t.name, "description": t.description or "", "parameters": t.parameters}
                         for t in tools], ensure_ascii=False)
    call = '{"name": "<tool name>", "arguments": {<arguments>}}'
    calls = call if max_calls == 1 else f"{call}, ..."
    if mode == "auto":
        how = ("Respond in JSON, either with `tool_calls` (a request to call tools) or with `response` "
               f'(a reply to the user): {{"tool_calls": [{calls}]}} or {{"response": "<your reply>"}}.')
    else:
        how = f"Respond by calling a tool, as a JSON list: [{calls}]."
    return f"You can call these tools:\n{listed}\n{how}"


def taught_conversation(messages: Sequence[Mapping[str, Any]], plan: ToolPlan) -> list[dict[str, Any]]:
    """``messages`` (template dicts) as a model without tool rendering reads them: the plan's
    instructions in the system message, an assistant's earlier calls as the JSON it answers in,
    and tool results as user turns naming their call (a template may know no ``tool`` role)."""
    out = [dict(m) for m in messages]
    if plan.instructions is None:
        return out
    for i, m in enumerate(out):
        if m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in m["tool_calls"]]
            body = {"tool_calls": calls} if plan.parser == REPLY_OR_CALL else calls
            text = json.dumps(body, ensure_ascii=False)
            out[i] = {"role": "assistant", "content": f"{m['content']}\n{text}" if m.get("content") else text}
        elif m.get("role") == "tool":
            call = f" {m['tool_call_id']}" if m.get("tool_call_id") else ""
            out[i] = {"role": "user", "content": f"Result of tool call{call}: {m.get('content') or ''}"}
    if out and out[0].get("role") == "system":
        out[0] = {**out[0], "content": f"{out[0].get('content') or ''}\n\n{plan.instructions}".lstrip()}
    else:
        out.insert(0, {"role": "system", "content": plan.instructions})
    return out


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
    rendered = tuple(dict(t) for t in tools)
    choice = "auto" if tool_choice is None else tool_choice
    if choice == "none":
        return ToolPlan("none", parsed, rendered)
    native = detect_parser(chat_template)
    # OpenAI's default is parallel calls. A model taught the tools by ruvllm gets one call per
    # answer unless the request asks for more (llama-server's default): a small model otherwise
    # repeats the same call until max_tokens.
    parallel = bool(parallel_tool_calls) if parallel_tool_calls is not None else native is not None
    if choice == "auto":
        max_calls = None if parallel else 1
        if native is not None:
            return ToolPlan("auto", parsed, rendered, parser=native, max_calls=max_calls)
        schema = reply_or_call_schema(parsed, max_calls=max_calls)
        return ToolPlan("auto", parsed, None, parser=REPLY_OR_CALL, max_calls=max_calls,
                        grammar=json_schema_grammar("tools", schema, kind="tool_choice auto (reply_or_call)"),
                        instructions=instructions(parsed, "auto", max_calls))
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
    if native is not None:
        return ToolPlan(mode, parsed, rendered, grammar=grammar, max_calls=max_calls)
    return ToolPlan(mode, parsed, None, grammar=grammar, max_calls=max_calls,
                    instructions=instructions(allowed, mode, max_calls))


def _call(name: Any, arguments: Any) -> ToolCall | None:
    if not isinstance(name, str):
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return ToolCall(name, {} if arguments is None else arguments)


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
    if plan.parser == REPLY_OR_CALL:
        return _reply_or_call(text, names)
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


def _reply_or_call(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    values = _json_objects(text)
    value = values[0] if len(values) == 1 and isinstance(values[0], Mapping) else None
    if value is None:
        # Cut short by max_tokens (the finish says so): the reply as far as it got, as it was
        # streamed; a call cut short is no call, and its JSON is not a reply either.
        return _partial_reply(text), []
    if isinstance(value.get("response"), str):
        return value["response"], []
    return "", _calls_from_values([value.get("tool_calls", [])], names)


#: The start of a ``reply_or_call`` reply, and one JSON string character or escape.
_REPLY_START = re.compile(r'\s*\{\s*"response"\s*:\s*"')
_STRING_PART = re.compile(r'(?:[^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*')


def streamable(text: str, plan: ToolPlan) -> str:
    """The content of a choice's output so far that is certain to be its content: what a
    stream may send. ``split_tool_calls`` of the finished output starts with it."""
    if plan.parser != REPLY_OR_CALL or plan.enforced:
        return text[:len(text) - hold_back(text, plan)]
    return _partial_reply(text)


def _partial_reply(text: str) -> str:
    """The decoded part of a ``reply_or_call`` reply in ``text`` ("" unless it is a reply)."""
    start = _REPLY_START.match(text)
    if start is None:  # not (yet) a reply: calls, or the reply's opening still coming
        return ""
    raw = _STRING_PART.match(text, start.end()).group(0)
    if re.search(r"\\ud[89ab][0-9a-fA-F]{2}$", raw, flags=re.I):
        raw = raw[:-6]  # half of a surrogate pair: wait for the other half
    return json.loads(f'"{raw}"', strict=False)


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
