"""Anthropic's Messages API (``/v1/messages``, ``/v1/messages/count_tokens``) on the same engine.

A thin surface: the body is checked here in Anthropic's terms (``max_tokens`` required,
``temperature`` in [0, 1], content blocks), translated into the chat request every surface runs
(:mod:`ruvllm.server.chat_run`: the same template, limits, grammar, tool plan, sampler), and the
outputs are written back as a ``message`` or as Anthropic's stream of named events
(``message_start``, ``content_block_start`` / ``_delta`` / ``_stop``, ``message_delta``,
``message_stop``). Tool calls become ``tool_use`` blocks and a ``tool_result`` block a tool turn.

What cannot be honoured is refused by name, in Anthropic's error shape (ruvllm.server.errors):
images and documents (ruvllm serves text models), extended ``thinking`` with a budget and
``output_config.effort`` (no reasoning for these models). Accepted without effect, each for a
reason: ``cache_control`` (the engine caches every prompt's prefix by itself),
``metadata.user_id`` (as OpenAI's ``user``), ``service_tier`` (one tier). ``temperature``,
``top_p`` and ``top_k``, which the current ``anthropic`` SDK no longer types but older clients
send, are honoured; ``output_config.format`` is structured output.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import Discriminator, Field, Tag, ValidationError

from ruvllm.errors import InvalidRequest
from ruvllm.server.chat_run import ChatRun, chat_prompt, start_chat
from ruvllm.server.errors import anthropic_error_body, ruvllm_error_body
from ruvllm.server.model_pool import ModelPool
from ruvllm.server.params import Limits
from ruvllm.server.schemas import ChatCompletionRequest, RequestBody, StrictModel
from ruvllm.server.sse import SSEResponse, named_sse_event
from ruvllm.types import GenerationResult, TokenOutput

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


#: A block of another kind (``image``, ``document``, ``thinking``...) is a 400 naming its
#: ``type``: ruvllm serves text models, and a block it cannot render is never dropped.
#: The tags say ``type=...``, so that error paths can leave them out (ruvllm.server.errors).
Block = Annotated[Annotated[TextBlock, Tag("type=text")] | Annotated[ToolUseBlock, Tag("type=tool_use")]
                  | Annotated[ToolResultBlock, Tag("type=tool_result")],
                  Discriminator(lambda v: f"type={v.get('type') if isinstance(v, dict) else v.type}")]


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
    """``disabled`` and ``adaptive`` (the model decides; these models never think) are served;
    ``enabled`` asks for a thinking budget, which is refused."""

    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = None


class OutputFormat(StrictModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(StrictModel):
    #: Reasoning effort: refused when set (these models have none to set).
    effort: str | None = None
    #: Structured output: the answer is JSON matching the schema (as ``response_format``).
    format: OutputFormat | None = None


class Metadata(StrictModel):
    #: Accepted, never used (as OpenAI's ``user``).
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


def _chat_messages(body: _Conversation) -> list[dict[str, Any]]:
    """The conversation as chat messages: ``tool_use`` blocks become the assistant's
    ``tool_calls``, ``tool_result`` blocks ``tool`` messages (before the turn's text)."""
    out: list[dict[str, Any]] = []
    if body.system:
        out.append({"role": "system", "content": _text(body.system)})
    for i, m in enumerate(body.messages):
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        texts, calls, results = [], [], []
        for j, block in enumerate(m.content):
            at = f"messages[{i}].content[{j}]"
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolUseBlock):
                if m.role != "assistant":
                    raise InvalidRequest(f"{at}.type", "a tool_use block belongs to an assistant turn")
                calls.append({"id": block.id, "type": "function",
                              "function": {"name": block.name, "arguments": json.dumps(block.input)}})
            else:
                if m.role != "user":
                    raise InvalidRequest(f"{at}.type", "a tool_result block belongs to a user turn")
                result = _text(block.content)
                results.append({"role": "tool", "tool_call_id": block.tool_use_id,
                                "content": f"Error: {result}" if block.is_error else result})
        out.extend(results)
        if calls:
            out.append({"role": "assistant", "content": "".join(texts) or None, "tool_calls": calls})
        elif texts or not results:
            out.append({"role": m.role, "content": "".join(texts)})
    return out


def _tool_fields(body: _Conversation) -> dict[str, Any]:
    if body.thinking is not None and body.thinking.type == "enabled":
        raise InvalidRequest("thinking.type", "extended thinking is not served for this model (it has no "
                             "reasoning parser); leave thinking out or set it to disabled or adaptive")
    if body.thinking is not None and body.thinking.budget_tokens is not None:
        raise InvalidRequest("thinking.budget_tokens", "this model does not think, so it has no thinking "
                             "budget; leave budget_tokens out")
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


def chat_request(body: MessagesRequest | CountTokensRequest) -> ChatCompletionRequest:
    """The chat request that ``body`` asks for (what every surface runs)."""
    fields: dict[str, Any] = {"model": body.model, "messages": _chat_messages(body), **_tool_fields(body)}
    config = body.output_config
    if config is not None and config.effort is not None:
        raise InvalidRequest("output_config.effort",
                             "this model has no reasoning effort to set; leave it out")
    if config is not None and config.format is not None:
        fields["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "output", "schema": config.format.schema_}}
    if isinstance(body, MessagesRequest):
        fields.update(max_tokens=body.max_tokens, stream=body.stream, stop=body.stop_sequences,
                      temperature=body.temperature, top_p=body.top_p, top_k=body.top_k)
    try:
        return ChatCompletionRequest(**fields)
    except ValidationError as exc:  # a value Anthropic's schema admits and the chat request does not
        first = exc.errors()[0]
        raise InvalidRequest(".".join(str(p) for p in first["loc"]), first["msg"]) from None


_STOP_REASONS = {"stop": "end_turn", "tool_calls": "tool_use", "length": "max_tokens"}


def _stop(finish: str, result: GenerationResult) -> tuple[str, str | None]:
    """``(stop_reason, stop_sequence)`` of a finished message."""
    if finish == "stop" and isinstance(result.stop_reason, str):
        return "stop_sequence", result.stop_reason
    return _STOP_REASONS.get(finish, "end_turn"), None


def _tool_use(call: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": "toolu_" + call["id"].removeprefix("call_"),
            "name": call["function"]["name"], "input": json.loads(call["function"]["arguments"])}


def _message(run: ChatRun, model: str, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
             output_tokens: int) -> dict[str, Any]:
    return {"id": run.submission.id, "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": stop[0], "stop_sequence": stop[1],
            "usage": {"input_tokens": len(run.prompt_ids), "output_tokens": output_tokens}}


async def _events(run: ChatRun, model: str) -> AsyncIterator[str]:
    """The message as Anthropic's stream: text deltas as the tokens come, then each tool call as
    a ``tool_use`` block with its input in one ``input_json_delta``."""
    fmt = run.formatter
    blocks = 0
    text_open = False
    batches = run.submission.stream()

    def text(delta: str) -> list[str]:
        nonlocal text_open
        out = []
        if not text_open:
            out.append(named_sse_event("content_block_start", {"type": "content_block_start", "index": blocks,
                                                      "content_block": {"type": "text", "text": ""}}))
            text_open = True
        out.append(named_sse_event("content_block_delta", {"type": "content_block_delta", "index": blocks,
                                                  "delta": {"type": "text_delta", "text": delta}}))
        return out

    try:
        yield named_sse_event("message_start", {"type": "message_start",
                                       "message": _message(run, model, [], (None, None), 0)})
        async for batch in batches:
            events: list[str] = []
            for _, item in batch.items:
                if isinstance(item, TokenOutput):
                    chunk = fmt.token(0, item)
                    delta = chunk["choices"][0]["delta"].get("content") if chunk else None
                    if delta:
                        events += text(delta)
                elif isinstance(item, GenerationResult):
                    last = fmt.finish(0, item.finish_reason.value)["choices"][0]
                    if last["delta"].get("content"):
                        events += text(last["delta"]["content"])
                    if text_open:
                        events.append(named_sse_event("content_block_stop", {"type": "content_block_stop",
                                                                    "index": blocks}))
                        blocks += 1
                    for call in last["delta"].get("tool_calls") or []:
                        use = _tool_use(call)
                        events.append(named_sse_event("content_block_start", {
                            "type": "content_block_start", "index": blocks,
                            "content_block": {**use, "input": {}}}))
                        events.append(named_sse_event("content_block_delta", {
                            "type": "content_block_delta", "index": blocks,
                            "delta": {"type": "input_json_delta", "partial_json": json.dumps(use["input"])}}))
                        events.append(named_sse_event("content_block_stop", {"type": "content_block_stop",
                                                                    "index": blocks}))
                        blocks += 1
                    reason, sequence = _stop(last["finish_reason"], item)
                    events.append(named_sse_event("message_delta", {
                        "type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                        "usage": {"output_tokens": item.usage.completion_tokens}}))
                    events.append(named_sse_event("message_stop", {"type": "message_stop"}))
                else:
                    status, body, _ = ruvllm_error_body(item)
                    error = anthropic_error_body(status, body["error"]["message"])
                    events.append(named_sse_event("error", error))
            if events:
                yield "".join(events)
            if batch.last:
                break
    finally:
        await batches.aclose()


def register_messages_routes(app: FastAPI, pool: ModelPool, limits: Limits) -> None:
    @app.post("/v1/messages")
    async def messages(body: MessagesRequest, request: Request) -> Response:
        chat = chat_request(body)
        async with pool.route(body.model) as route:
            run = await start_chat(route, chat, limits, id_prefix="msg")
            if body.stream:
                return SSEResponse(_events(run, route.served_name), on_close=run.submission.cancel)
            outcomes = await run.submission.results(request.is_disconnected)
            if outcomes is None:
                return Response(status_code=499)  # the client is gone
            whole = run.formatter.complete(outcomes, [len(run.prompt_ids)])["choices"][0]
            message = whole["message"]
            content = [{"type": "text", "text": message["content"]}] if message["content"] else []
            content += [_tool_use(c) for c in message.get("tool_calls") or []]
            result = outcomes[0][1]
            stop = _stop(whole["finish_reason"], result)
            output_tokens = result.usage.completion_tokens
            return JSONResponse(_message(run, route.served_name, content, stop, output_tokens))

    @app.post("/v1/messages/count_tokens")
    async def count_tokens(body: CountTokensRequest) -> dict[str, int]:
        async with pool.route(body.model) as route:
            return {"input_tokens": len(await chat_prompt(route, chat_request(body)))}
