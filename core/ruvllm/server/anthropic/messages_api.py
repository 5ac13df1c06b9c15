"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) on the same engine.

A thin surface: the body is checked here in Anthropic's terms (``max_tokens`` required,
``temperature`` in [0, 1], content blocks), translated straight into the lifecycle's neutral chat
request (:class:`~ruvllm.server.lifecycle.request_input.ChatInput`, run by
:mod:`ruvllm.server.lifecycle.chat_run`: the same template, limits, grammar, tool plan, sampler), and the
outputs are written back as a ``message`` or as Anthropic's stream of named events
(``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``,
``message_stop``). Tool calls become ``tool_use`` blocks and a ``tool_result`` block a tool turn.

A model that thinks (:func:`ruvllm.server.lifecycle.chat_run.thinks`: its chat template writes think
tags, or ``--reasoning-format deepseek``) answers with a ``thinking`` block (``signature`` empty:
nothing here is signed) before its text, streamed as ``thinking_delta`` events and a
``signature_delta``. Its thinking is the template's and the model's to decide, so ``thinking``
only says whether it is returned: left out, ``adaptive`` or ``enabled``, it is; ``disabled``
drops it from the answer (as Anthropic returns none; its tokens still count in
``output_tokens``). A thinking budget cannot be enforced here, so ``budget_tokens`` is accepted
only where it cannot bind (at least ``max_tokens``). Thinking blocks of earlier answers sent
back are accepted and dropped on every model, as thinking templates drop earlier thinking.

What cannot be honoured is refused by name, in Anthropic's error shape (ruvllm.server.http.errors):
images and documents (ruvllm serves text models), ``thinking`` enabled or with a budget on a
model that does not think, a budget below ``max_tokens``, ``output_config.effort`` (no effort
can be set). ``metadata.user_id`` is the request's tenant, as OpenAI's ``user`` is (a learning
plugin, SONA, learns per tenant). Accepted without effect, each for a reason: ``cache_control``
(the engine caches every prompt's prefix by itself), ``service_tier`` (one tier).
``temperature``, ``top_p`` and ``top_k``, which the current ``anthropic`` SDK no longer types but
older clients send, are honoured; ``output_config.format`` is structured output.
"""

from __future__ import annotations

import functools
import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Discriminator, Field, Tag

from ruvllm.errors import InvalidRequest, RuvllmError
from ruvllm.guided.grammar import from_response_format
from ruvllm.guided.tools import ToolCall
from ruvllm.server.http.errors import anthropic_error_body, ruvllm_error_body
from ruvllm.server.http.field_names import FieldNames, in_terms
from ruvllm.server.http.sse import named_sse_event
from ruvllm.server.http.strict_fields import RequestBody, StrictModel, type_tag
from ruvllm.server.lifecycle.answering import answer
from ruvllm.server.lifecycle.chat_run import ChatRun, chat_prompt, start_chat, thinks
from ruvllm.server.lifecycle.completion_service import Outcome
from ruvllm.server.lifecycle.events import Event, Finish, Step
from ruvllm.server.lifecycle.model_pool import ModelPool
from ruvllm.server.lifecycle.params import Limits
from ruvllm.server.lifecycle.request_input import ChatInput, Sampling
from ruvllm.types import GenerationResult

_Text = Annotated[str, Field(min_length=1)]


class CacheControl(StrictModel):
    """Accepted and unused: the engine caches every prompt's prefix by itself."""

    type: Literal["ephemeral"]
    ttl: str | None = None


class TextBlock(StrictModel):
    type: Literal["text"]
    text: str
    cache_control: CacheControl | None = None
    #: Citations of an earlier answer: accepted, not rendered (as OpenAI's ``annotations``).
    citations: list[Any] | None = None


class ToolUseBlock(StrictModel):
    type: Literal["tool_use"]
    id: _Text
    name: _Text
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(StrictModel):
    type: Literal["tool_result"]
    tool_use_id: _Text
    content: str | list[TextBlock] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None


class ThinkingBlock(StrictModel):
    """An earlier answer's thinking, sent back: accepted and dropped (thinking templates render
    earlier answers without their thinking, and Anthropic strips it from context too)."""

    type: Literal["thinking"]
    thinking: str
    signature: str


class RedactedThinkingBlock(StrictModel):
    """An earlier answer's thinking as Anthropic encrypts it: accepted and dropped, as thinking."""

    type: Literal["redacted_thinking"]
    data: str


#: A block of another kind (``image``, ``document``...) is a 400 naming its ``type``: ruvllm
#: serves text models, and a block it cannot render is never dropped (earlier thinking is dropped
#: because no model renders it). The tags say ``type=...``, so that error paths can leave them
#: out (ruvllm.server.http.errors).
Block = Annotated[Annotated[TextBlock, Tag("type=text")] | Annotated[ToolUseBlock, Tag("type=tool_use")]
                  | Annotated[ToolResultBlock, Tag("type=tool_result")]
                  | Annotated[ThinkingBlock, Tag("type=thinking")]
                  | Annotated[RedactedThinkingBlock, Tag("type=redacted_thinking")],
                  Discriminator(type_tag)]


class Message(StrictModel):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class Tool(StrictModel):
    name: _Text
    description: str | None = None
    input_schema: dict[str, Any]
    type: Literal["custom"] | None = None
    cache_control: CacheControl | None = None


class ToolChoice(StrictModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class Thinking(StrictModel):
    """Whether a thinking model's thinking is returned (:func:`thinking_shown`); on a model that
    does not think, ``disabled`` and ``adaptive`` (the model decides) are what it does."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class OutputFormat(StrictModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(StrictModel):
    #: Reasoning effort: refused when set (no model here has an effort to set).
    effort: str | None = None
    #: Structured output: the answer is JSON matching the schema (as ``response_format``).
    format: OutputFormat | None = None


class Metadata(StrictModel):
    #: The end user: the request's tenant, as OpenAI's ``user`` (:func:`chat_request`).
    user_id: str | None = None


class _Conversation(RequestBody):
    model: str
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    #: Accepted and unused: every prompt's prefix is cached by the engine.
    cache_control: CacheControl | None = None


class CountTokensRequest(_Conversation):
    pass


class MessagesRequest(_Conversation):
    max_tokens: int = Field(ge=1)
    stop_sequences: list[_Text] | None = None
    stream: bool = False
    temperature: float | None = Field(None, ge=0.0, le=1.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=0)
    metadata: Metadata | None = None
    #: Accepted: this server has one tier.
    service_tier: Literal["auto", "standard_only"] | None = None


def _text(content: str | list[TextBlock]) -> str:
    return content if isinstance(content, str) else "".join(b.text for b in content)


def _chat_messages(body: _Conversation) -> tuple[list[dict[str, Any]], list[str]]:
    """The conversation as the chat template's messages, and the field each came from:
    ``tool_use`` blocks become the assistant's ``tool_calls`` (their input the arguments object),
    ``tool_result`` blocks ``tool`` messages (before the turn's text)."""
    out: list[dict[str, Any]] = []
    origins: list[str] = []

    def add(message: dict[str, Any], origin: str) -> None:
        out.append(message)
        origins.append(origin)

    if body.system:
        add({"role": "system", "content": _text(body.system)}, "system")
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            add({"role": m.role, "content": m.content}, f"messages[{i}]")
            continue
        texts, calls, results = [], [], []
        for j, block in enumerate(m.content):
            at = f"messages[{i}].content[{j}]"
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ThinkingBlock | RedactedThinkingBlock):
                if m.role != "assistant":
                    raise InvalidRequest(f"{at}.type", f"a {block.type} block belongs to an assistant turn")
            elif isinstance(block, ToolUseBlock):
                if m.role != "assistant":
                    raise InvalidRequest(f"{at}.type", "a tool_use block belongs to an assistant turn")
                calls.append({"id": block.id, "type": "function",
                              "function": {"name": block.name, "arguments": block.input}})
            else:
                if m.role != "user":
                    raise InvalidRequest(f"{at}.type", "a tool_result block belongs to a user turn")
                result = _text(block.content)
                results.append(({"role": "tool", "tool_call_id": block.tool_use_id,
                                 "content": f"Error: {result}" if block.is_error else result}, at))
        for result, at in results:
            add(result, at)
        if calls:
            add({"role": "assistant", "content": "".join(texts), "tool_calls": calls},
                f"messages[{i}]")
        elif texts or not results:
            add({"role": m.role, "content": "".join(texts)}, f"messages[{i}]")
    return out, origins


def thinking_shown(body: _Conversation, model_thinks: bool) -> bool:
    """Whether the answer carries the model's thinking (``thinking`` left out, ``adaptive`` or
    ``enabled`` on a model that thinks); what cannot be honoured is refused by name."""
    thinking = body.thinking
    if thinking is None:
        return model_thinks
    if not model_thinks:
        if thinking.type == "enabled":
            raise InvalidRequest("thinking.type", "this model does not think (its chat template writes no "
                                 "think tags, or the server runs --reasoning-format none); leave thinking "
                                 "out or set it to disabled or adaptive")
        if thinking.budget_tokens is not None:
            raise InvalidRequest("thinking.budget_tokens", "this model does not think, so it has no "
                                 "thinking budget; leave budget_tokens out")
        return False
    budget = thinking.budget_tokens
    if budget is not None and thinking.type != "enabled":
        raise InvalidRequest("thinking.budget_tokens", f"only applies to type enabled, not {thinking.type}")
    max_tokens = getattr(body, "max_tokens", None)
    if budget is not None and max_tokens is not None and budget < max_tokens:
        raise InvalidRequest("thinking.budget_tokens", "ruvllm cannot stop a model's thinking at a budget "
                             "(the chat template and the model decide how long it thinks, within max_tokens "
                             f"with the answer); a budget of at least max_tokens ({max_tokens}), which "
                             "cannot bind, is accepted, or send thinking adaptive or leave it out")
    return thinking.type != "disabled"


def _tool_fields(body: _Conversation) -> dict[str, Any]:
    if not body.tools:
        if body.tool_choice is not None and body.tool_choice.type != "none":
            raise InvalidRequest("tool_choice", "needs tools")
        return {}
    fields: dict[str, Any] = {"tools": [
        {"type": "function", "function": {"name": t.name, "description": t.description,
                                          "parameters": t.input_schema}} for t in body.tools]}
    choice = body.tool_choice
    if choice is not None:
        if choice.type == "tool":
            if not choice.name:
                raise InvalidRequest("tool_choice.name", "is required with type tool")
            fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
        else:
            fields["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[choice.type]
        if choice.name and choice.type != "tool":
            raise InvalidRequest("tool_choice.name", f"only applies to type tool, not {choice.type}")
        if choice.disable_parallel_tool_use is not None:
            fields["parallel_tool_calls"] = not choice.disable_parallel_tool_use
    return fields


#: The neutral request's fields -> the Messages API's, for the lifecycle's refusals (field_names).
_ANTHROPIC_FIELDS = {
    "tools[*].function": "tools[*]", "tools[*].function.parameters": "tools[*].input_schema",
    "tool_choice.function": "tool_choice", "parallel_tool_calls": "tool_choice.disable_parallel_tool_use",
    "response_format": "output_config.format", "response_format.json_schema": "output_config.format",
    "stop": "stop_sequences", "prompt": "messages",
}


def chat_request(body: MessagesRequest | CountTokensRequest) -> tuple[ChatInput, FieldNames]:
    """The neutral chat request that ``body`` asks for, and the names of its fields in ``body``'s
    terms; a refusal while it is built names the field ``body`` sent."""
    messages, origins = _chat_messages(body)
    names = FieldNames.of(_ANTHROPIC_FIELDS, origins)
    config = body.output_config
    if config is not None and config.effort is not None:
        raise InvalidRequest("output_config.effort", "ruvllm cannot set a model's reasoning effort (a "
                             "thinking model thinks as its chat template has it); leave it out")
    with names.speaking():
        grammar = None
        if config is not None and config.format is not None:
            schema = {"name": "output", "schema": config.format.schema_}
            grammar = from_response_format({"type": "json_schema", "json_schema": schema})
        sampling = Sampling()
        tenant = None
        if isinstance(body, MessagesRequest):
            sampling = Sampling(max_tokens=body.max_tokens, stop=body.stop_sequences,
                                temperature=body.temperature, top_p=body.top_p, top_k=body.top_k)
            tenant = body.metadata.user_id if body.metadata is not None else None
        return ChatInput(messages=messages, sampling=sampling, grammar=grammar, tenant=tenant,
                         **_tool_fields(body)), names


_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def _stop(finish: Finish) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a finished message."""
    stopped_by = finish.result.stop_reason
    if finish.reason == "stop" and isinstance(stopped_by, str):
        return "stop_sequence", stopped_by
    return _STOP_REASONS.get(finish.reason, "end_turn"), None


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_" + call.id.removeprefix("call_"), "name": call.name,
            "input": call.arguments}


def _usage(prompt_tokens: int, result: GenerationResult | None) -> dict[str, int]:
    """Anthropic's usage: the prompt tokens read from the prefix cache are ``cache_read_input_tokens``
    and ``input_tokens`` the rest, as Anthropic counts a cache hit (their sum is the prompt);
    before the result (a stream's start) nothing is known to be cached yet."""
    cached = result.usage.cached_prompt_tokens if result is not None else 0
    return {"input_tokens": prompt_tokens - cached, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": cached,
            "output_tokens": result.usage.completion_tokens if result is not None else 0}


def _message(run: ChatRun, model: str, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
             result: GenerationResult | None) -> dict[str, Any]:
    return {"id": run.submission.id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": _usage(len(run.prompt_ids), result)}


def stream_error(exc: RuvllmError, names: FieldNames) -> str:
    """A failure after the stream started, as Anthropic's ``error`` event naming the field the
    client sent: this surface's one shape of an error inside a stream."""
    status, body, _ = ruvllm_error_body(in_terms(exc, names))
    return named_sse_event("error", anthropic_error_body(status, body["error"]["message"]))


class _Blocks:
    """The content blocks of one streamed message, opened and closed in order: the thinking, the
    text, then each tool call."""

    def __init__(self, run: ChatRun, thinking: bool, names: FieldNames) -> None:
        self.run = run
        #: Whether the model's thinking is shown.
        self.thinking = thinking
        self.names = names
        self.index = 0
        #: The kind of the block open now (``thinking``, ``text``), or None.
        self.open: str | None = None

    def _event(self, kind: str, **fields: Any) -> str:
        return named_sse_event(kind, {"type": kind, **fields})

    def close(self) -> list[str]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":  # nothing here is signed; Anthropic sends the signature last
            out.append(self._event("content_block_delta", index=self.index,
                                   delta={"type": "signature_delta", "signature": ""}))
        out.append(self._event("content_block_stop", index=self.index))
        self.index += 1
        self.open = None
        return out

    def delta(self, kind: str, text: str) -> list[str]:
        """``text`` added to the block of ``kind`` (``thinking`` or ``text``), opening it."""
        out = []
        if self.open != kind:
            out += self.close()
            block = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" \
                else {"type": "text", "text": ""}
            out.append(self._event("content_block_start", index=self.index, content_block=block))
            self.open = kind
        delta = {"type": "thinking_delta", "thinking": text} if kind == "thinking" \
            else {"type": "text_delta", "text": text}
        out.append(self._event("content_block_delta", index=self.index, delta=delta))
        return out

    def tool_use(self, call: ToolCall) -> list[str]:
        """A tool call as a whole block, its input in one ``input_json_delta``."""
        use = _tool_use(call)
        out = self.close()
        out += [self._event("content_block_start", index=self.index, content_block={**use, "input": {}}),
                self._event("content_block_delta", index=self.index, delta={
                    "type": "input_json_delta", "partial_json": json.dumps(use["input"])}),
                self._event("content_block_stop", index=self.index)]
        self.index += 1
        return out

    def finish(self, finish: Finish) -> list[str]:
        reason, sequence = _stop(finish)
        return [*self.close(),
                named_sse_event("message_delta", {
                    "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                    "usage": _usage(len(self.run.prompt_ids), finish.result)}),
                named_sse_event("message_stop", {"type": "message_stop"})]

    def render(self, events: list[Event]) -> list[str]:
        """The stream events of the answer's events: thinking (when shown) and text deltas as they
        come, each tool call as a ``tool_use`` block, then the message's end (logprobs: none in
        this API)."""
        step = Step.of(events)
        out = self.delta("thinking", step.thinking) if step.thinking and self.thinking else []
        if step.text:
            out += self.delta("text", step.text)
        for call in step.calls:
            out += self.tool_use(call)
        if step.finish is not None:
            out += self.finish(step.finish)
        if step.failed is not None:
            out.append(stream_error(step.failed.error, self.names))
        return out


def _events(run: ChatRun, model: str, thinking: bool, names: FieldNames) -> AsyncIterator[str]:
    """The message as Anthropic's stream, from ``message_start`` on."""
    choice = run.reading.choice()
    blocks = _Blocks(run, thinking, names)
    return run.submission.writes(lambda item: blocks.render(choice.of(item)), first=named_sse_event(
        "message_start", {"type": "message_start", "message": _message(run, model, [], (None, None), None)}))


def _whole_message(run: ChatRun, model: str, thinking: bool, outcomes: list[Outcome]) -> dict[str, Any]:
    """The whole message: thinking (when ``thinking``), text, then each tool call as a block."""
    outputs, result = outcomes[0]
    answer = run.reading.whole(outputs, result)
    thought = answer.reasoning if thinking else None
    content = [{"type": "thinking", "thinking": thought, "signature": ""}] if thought else []
    if answer.text:
        content.append({"type": "text", "text": answer.text})
    content += [_tool_use(c) for c in answer.calls]
    return _message(run, model, content, _stop(answer.finish), result)


def register_messages_routes(app: FastAPI, pool: ModelPool, limits: Limits) -> None:
    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request) -> Response:
        chat, names = chat_request(body)
        async with pool.route(body.model) as route:
            shown = thinking_shown(body, thinks(route, limits))
            with names.speaking():
                run = await start_chat(route, chat, limits, id_prefix="msg")
                model = route.served_name
                return await answer(
                    run.submission, request,
                    streamed=functools.partial(_events, run, model, shown, names) if body.stream else None,
                    whole=lambda outcomes: JSONResponse(_whole_message(run, model, shown, outcomes)))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest) -> dict[str, int]:
        chat, names = chat_request(body)
        async with pool.route(body.model) as route:
            thinking_shown(body, thinks(route, limits))
            with names.speaking():
                return {"input_tokens": len(await chat_prompt(route, chat))}
