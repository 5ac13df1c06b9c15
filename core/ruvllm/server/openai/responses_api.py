"""OpenAI's Responses API (``POST /v1/responses`` and its stored responses) on the same engine.

A thin surface, as :mod:`ruvllm.server.anthropic.messages_api` is for Anthropic's API: the body is checked
here in the Responses API's terms (``input`` items, ``instructions``, flat function tools,
``text.format``, ``max_output_tokens``), translated straight into the lifecycle's neutral chat request
(:class:`~ruvllm.server.lifecycle.request_input.ChatInput`, run by
:mod:`ruvllm.server.lifecycle.chat_run`: the same template, limits, grammar, tool plan, sampler), and the
outputs are written back as a ``response`` object or as its stream of typed events
(:mod:`ruvllm.server.openai.responses_output`). A refusal raised by the shared chat path names the
Responses field, not the chat one (``max_output_tokens``, ``text.format.schema``, ``input[3]``).

Responses are kept (:mod:`ruvllm.server.openai.response_store`, unless ``store: false``), so
``previous_response_id`` continues a stored conversation, ``background: true`` runs a response to
fetch later, and ``GET``/``DELETE /v1/responses/{id}``, its ``cancel`` and ``input_items`` serve
them; ``conversation`` continues a conversation of the Conversations API, and an
``item_reference`` stands for the stored item it names (an item of a kept response or
conversation). Refused by name: built-in (hosted) tools and their items, image/file/audio parts
(text models), a reasoning effort other than ``none`` and summaries (a thinking model thinks as
its chat template has it, and its reasoning is returned whole, not summarised),
``truncation: "auto"`` (a prompt that does not fit is a 400, never cut). ``user`` is the
request's tenant, as chat's is (a learning plugin, SONA, learns per tenant). Accepted without
effect, each for a reason: ``safety_identifier`` (no per-user policy), ``prompt_cache_key``
(the prefix cache is automatic), the ids, statuses, annotations and logprobs of replayed output
items, and replayed ``reasoning`` items (dropped on every model, as thinking templates drop
earlier thinking). docs/server.md's Request fields table lists every field.

A model that thinks (:func:`ruvllm.server.lifecycle.chat_run.thinks`) answers with a ``reasoning`` item
before its message (responses_output); ``reasoning.effort: "none"`` drops it from the answer (the
model still thinks as its template has it; ``output_tokens_details.reasoning_tokens`` counts it).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import re
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Literal

import attrs
from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, Response

from ruvllm.errors import InvalidRequest, RuvllmError, StoredObjectNotFound
from ruvllm.guided.grammar import from_response_format
from ruvllm.guided.tools import REPLY_OR_CALL, tool_format
from ruvllm.server.http.cursor_page import page
from ruvllm.server.http.errors import ruvllm_error_body
from ruvllm.server.http.field_names import FieldNames
from ruvllm.server.http.strict_fields import refuse_unknown_query
from ruvllm.server.lifecycle.answering import answer
from ruvllm.server.lifecycle.chat_run import ChatRun, start_chat, thinks
from ruvllm.server.lifecycle.completion_service import Outcome
from ruvllm.server.lifecycle.model_pool import ModelPool
from ruvllm.server.lifecycle.params import Limits
from ruvllm.server.lifecycle.request_input import ChatInput, Sampling
from ruvllm.server.openai.conversations_api import Conversation, ConversationStore, conversation_id
from ruvllm.server.openai.response_store import ResponseStore, StoredResponse, dumped, with_ids
from ruvllm.server.openai.responses_output import Envelope, response_events, whole_response
from ruvllm.server.openai.responses_schema import (
    LOGPROBS_INCLUDE,
    NOTHING_TO_INCLUDE,
    FunctionCallItem,
    FunctionChoice,
    JsonSchemaFormat,
    MessageItem,
    Reasoning,
    ReasoningItem,
    RefusalPart,
    ResponsesRequest,
    TextConfig,
)


def _refuse_unserved(body: ResponsesRequest) -> None:
    if body.truncation == "auto":
        raise InvalidRequest("truncation", "ruvllm never drops part of the input: a prompt that does "
                             "not fit is a 400; leave it out or set it to disabled")


def reasoning_shown(reasoning: Reasoning | None, model_thinks: bool) -> bool:
    """Whether the answer carries a thinking model's reasoning (as a ``reasoning`` item): unless
    ``effort`` is ``none``. What cannot be honoured is refused by name."""
    effort = reasoning.effort if reasoning is not None else None
    if effort not in (None, "none"):
        why = ("a thinking model thinks as its chat template has it, and ruvllm cannot set how much; leave "
               "it out (the reasoning is returned) or set it to none (it is left out of the answer)"
               if model_thinks else "this model does not think (its chat template writes no think tags, "
               "or the server runs --reasoning-format none), so it has no effort to set; leave it out or "
               "set it to none")
        raise InvalidRequest("reasoning.effort", why)
    for field in ("summary", "generate_summary"):
        if reasoning is not None and getattr(reasoning, field) is not None:
            raise InvalidRequest(f"reasoning.{field}", "ruvllm does not summarise reasoning: a thinking "
                                 "model's reasoning is returned whole, as reasoning_text; leave it out")
    return model_thinks and effort is None


def _logprobs(body: ResponsesRequest) -> bool:
    """Whether ``include`` asks for the answer's logprobs; its other values are refused by name."""
    asked = False
    for i, value in enumerate(body.include or []):
        if value == LOGPROBS_INCLUDE:
            asked = True
        elif value != NOTHING_TO_INCLUDE:
            raise InvalidRequest(f"include[{i}]", f"{value!r} is output of a built-in tool or an image "
                                 f"input, which ruvllm does not serve; it can include {LOGPROBS_INCLUDE!r}")
    if body.top_logprobs is not None and not asked:
        raise InvalidRequest("top_logprobs", f"needs include: [{LOGPROBS_INCLUDE!r}] (the logprobs it adds "
                             "alternatives to)")
    return asked


def _text(content: str | list[Any]) -> str:
    if isinstance(content, str):
        return content
    return "".join(p.refusal if isinstance(p, RefusalPart) else p.text for p in content)


def _messages(body: ResponsesRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """The conversation as the chat template's messages, and the Responses field each came from.

    ``developer`` turns are the system turns chat templates know. A model's ``function_call``
    items join the assistant turn they follow (text, then its calls, as the model answered), and
    each ``function_call_output`` is a tool message."""
    out: list[dict[str, Any]] = []
    origins: list[str] = []

    def add(message: dict[str, Any], origin: str) -> None:
        out.append(message)
        origins.append(origin)

    if body.instructions:
        add({"role": "system", "content": body.instructions}, "instructions")
    if isinstance(body.input, str):
        add({"role": "user", "content": body.input}, "input")
        return out, origins
    for i, item in enumerate(body.input):
        at = f"input[{i}]"
        if isinstance(item, MessageItem):
            add({"role": "system" if item.role == "developer" else item.role, "content": _text(item.content)},
                at)
        elif isinstance(item, FunctionCallItem):
            try:  # decoded once here: the chat template renders the object
                arguments = json.loads(item.arguments or "{}")
            except json.JSONDecodeError as exc:
                raise InvalidRequest(f"{at}.arguments", f"is not valid JSON ({exc.msg} at character "
                                     f"{exc.pos}); send the arguments the response gave") from None
            call = {"id": item.call_id, "type": "function",
                    "function": {"name": item.name, "arguments": arguments}}
            if out and out[-1]["role"] == "assistant":
                out[-1].setdefault("tool_calls", []).append(call)
            else:
                add({"role": "assistant", "content": "", "tool_calls": [call]}, at)
        elif isinstance(item, ReasoningItem):
            continue  # an earlier answer's thinking: templates render earlier answers without it
        else:
            add({"role": "tool", "tool_call_id": item.call_id, "content": _text(item.output)}, at)
    if not out:
        raise InvalidRequest("input", "holds only reasoning items, which are dropped (earlier thinking is "
                             "not rendered); send the conversation's messages")
    return out, origins


def _tool_fields(body: ResponsesRequest) -> dict[str, Any]:
    fields: dict[str, Any] = {"parallel_tool_calls": body.parallel_tool_calls}
    if body.tools:
        fields["tools"] = [{"type": "function", "function": {
            "name": t.name, "description": t.description,
            **({"parameters": t.parameters} if t.parameters is not None else {})}} for t in body.tools]
    choice = body.tool_choice
    if isinstance(choice, FunctionChoice):
        fields["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice is not None:
        fields["tool_choice"] = choice
    return fields


def _response_format(text: TextConfig | None) -> dict[str, Any] | None:
    fmt = text.format if text is not None else None
    if isinstance(fmt, JsonSchemaFormat):
        return {"type": "json_schema", "json_schema": {"name": fmt.name, "schema": fmt.schema_}}
    return {"type": fmt.type} if fmt is not None else None


#: The neutral request's fields -> the Responses API's, for the lifecycle's refusals (field_names).
_RESPONSES_FIELDS = {
    "max_tokens": "max_output_tokens", "response_format": "text.format",
    "response_format.json_schema": "text.format", "tools[*].function": "tools[*]",
    "tool_choice.function": "tool_choice", "logprobs": "include", "prompt": "input",
}


@attrs.frozen
class Translation:
    """A Responses body as the neutral chat request it asks for."""

    chat: ChatInput
    #: The chat request's fields in this API's names (``input[3]``, ``max_output_tokens``).
    names: FieldNames


def translate(body: ResponsesRequest) -> Translation:
    """The neutral chat request that ``body`` asks for, with what cannot be honoured refused by
    name (in this API's names)."""
    _refuse_unserved(body)
    logprobs = _logprobs(body)
    messages, origins = _messages(body)
    # A refusal of the logprobs names include, or top_logprobs where alternatives were asked for.
    asked = {"logprobs": "top_logprobs"} if body.top_logprobs else {}
    names = FieldNames.of({**_RESPONSES_FIELDS, **asked}, origins, words={"max_tokens": "max_output_tokens"})
    # The ranges of ResponsesRequest are the lifecycle's, so every body that parsed is in range.
    sampling = Sampling(max_tokens=body.max_output_tokens, temperature=body.temperature, top_p=body.top_p,
                        seed=body.seed, top_k=body.top_k, min_p=body.min_p,
                        repetition_penalty=body.repetition_penalty,
                        logprobs=(body.top_logprobs or 0) if logprobs else None)
    with names.speaking():
        grammar = from_response_format(_response_format(body.text))
    return Translation(ChatInput(messages=messages, sampling=sampling, grammar=grammar, tenant=body.user,
                                 **_tool_fields(body)), names)


def check_strict(body: ResponsesRequest, chat_template: str | None) -> None:
    """Refuse ``strict: true`` where ruvllm would not constrain the calls: under ``auto`` a model
    whose template renders tools writes calls in its own format, which is parsed, not enforced
    (on a model served the ``reply_or_call`` format, and under ``required`` or a named function,
    a grammar keeps the arguments to ``parameters``)."""
    if body.tool_choice not in (None, "auto") or tool_format(chat_template) == REPLY_OR_CALL:
        return
    for i, tool in enumerate(body.tools or []):
        if tool.strict:
            raise InvalidRequest(f"tools[{i}].strict", "under tool_choice auto this model writes calls in "
                                 "its own format, which ruvllm parses without constraining the arguments; "
                                 "set strict to false, or tool_choice to required or a function")


def parallel_calls(body: ResponsesRequest, chat_template: str | None) -> bool:
    """Whether one answer may hold several calls: the request's say, else ruvllm's default (one
    call for a model taught the tools by ruvllm, as guided/tools.py explains)."""
    if body.parallel_tool_calls is not None:
        return body.parallel_tool_calls
    return tool_format(chat_template) != REPLY_OR_CALL


def input_items(body: ResponsesRequest) -> list[dict[str, Any]]:
    """The request's own ``input`` as items (a string is one user message), as they are stored."""
    if isinstance(body.input, str):
        return [{"type": "message", "role": "user", "content": body.input}]
    return dumped(body.input)


def resolved(items: list[dict[str, Any]], store: ResponseStore,
             conversations: ConversationStore) -> list[dict[str, Any]]:
    """``items`` with each ``item_reference`` replaced by (a copy of) the stored item it names:
    an item of a kept response's input or output, or of a kept conversation."""
    out = []
    for item in items:
        if item.get("type") == "item_reference":
            found = store.item(item["id"]) or conversations.item(item["id"])
            if found is None:
                raise StoredObjectNotFound("item", item["id"], "an item_reference names an item of a stored "
                                           "response (its input or output) or of a conversation; send "
                                           "the item itself")
            item = copy.deepcopy(found)
        out.append(item)
    return out


def continued(body: ResponsesRequest, items: list[dict[str, Any]]) -> ResponsesRequest:
    """``body`` with ``items`` (the conversation it continues, then its own input) as its input."""
    fields = body.model_dump(by_alias=True, exclude_unset=True)
    return ResponsesRequest.model_validate({**fields, "input": items, "previous_response_id": None})


def _history(body: ResponsesRequest, store: ResponseStore,
             conversations: ConversationStore) -> tuple[list[dict[str, Any]], Conversation | None]:
    """The items ``body`` continues (a stored response's conversation, or a conversation's items)
    and the conversation its answer joins, if any."""
    if body.previous_response_id is not None:
        if body.conversation is not None:
            raise InvalidRequest("conversation", "continues a conversation, as previous_response_id does; "
                                 "send one of the two")
        previous = store.get(body.previous_response_id)
        if previous.running:
            raise InvalidRequest("previous_response_id", f"{previous.id} is still in progress (background); "
                                 "continue it once GET /v1/responses/{id} says it is completed")
        return previous.conversation(), None
    if body.conversation is not None:
        conversation = conversations.get(conversation_id(body.conversation))
        return list(conversation.items), conversation
    return [], None


@contextlib.contextmanager
def numbered_after(earlier: int) -> Iterator[None]:
    """Re-raise refusals naming the request's own items as the client numbered them: ``input``
    holds the ``earlier`` items of the stored conversation first, and a refusal of one of those
    names ``previous_response_id``."""
    try:
        yield
    except InvalidRequest as exc:
        at = re.match(r"^input\[(\d+)\]", exc.field)
        if at is not None and earlier:
            index = int(at[1]) - earlier
            field = f"input[{index}]{exc.field[at.end():]}" if index >= 0 else "previous_response_id"
            exc.args = (f"{field}: {str(exc).removeprefix(f'{exc.field}: ')}",)
            exc.field = field
        raise


def _check_storing(body: ResponsesRequest, store: ResponseStore) -> bool:
    """Whether this response is kept: ``store`` (true unless false, as OpenAI's) on a server that
    keeps any; what needs it is refused without it."""
    storing = body.store is not False and store.capacity > 0
    if body.background:
        if not storing:
            raise InvalidRequest("background", "a background response is fetched by its id, so it needs "
                                 "store (not false) on a server that keeps responses ([server] "
                                 "stored_responses > 0)")
        if body.stream:
            raise InvalidRequest("stream", "a background response is fetched with GET /v1/responses/{id}; "
                                 "leave stream out, or leave background out to stream it")
    return storing


async def _in_background(run: ChatRun, envelope: Envelope, names: FieldNames, stored: StoredResponse,
                         route_scope: contextlib.AsyncExitStack,
                         answered: Callable[[dict[str, Any]], None]) -> None:
    """A background response's run: its outcome becomes the stored response (and ``answered``
    is told of an answer; a refusal names the field in this API's ``names``)."""
    async def cancelled() -> bool:
        return stored.cancelled

    async with route_scope:
        try:
            with names.speaking():
                outcomes = await run.submission.results(cancelled)
            if not stored.cancelled:
                stored.response = whole_response(run, envelope, outcomes)
                answered(stored.response)
        except RuvllmError as exc:
            message = ruvllm_error_body(exc)[1]["error"]["message"]
            stored.response = envelope.response("failed", [], None,
                                                {"code": "server_error", "message": message})
        except asyncio.CancelledError:
            run.submission.cancel()
            stored.response = {**stored.response, "status": "cancelled"}
            raise


def register_responses_routes(app: FastAPI, pool: ModelPool, limits: Limits, store: ResponseStore,
                              conversations: ConversationStore) -> None:
    @app.post("/v1/responses")
    async def responses(body: ResponsesRequest, request: Request) -> Response:
        storing = _check_storing(body, store)
        history, conversation = _history(body, store, conversations)
        sent = input_items(body)
        own = with_ids(resolved(sent, store, conversations))
        items = [*history, *own]
        rebuilt = bool(history) or any(item.get("type") == "item_reference" for item in sent)
        with numbered_after(len(history)):
            translation = translate(continued(body, items) if rebuilt else body)
        route_scope = contextlib.AsyncExitStack()
        route = await route_scope.enter_async_context(pool.route(body.model))
        try:
            template = route.engine.info.chat_template
            check_strict(body, template)
            shown = reasoning_shown(body.reasoning, thinks(route, limits))
            with numbered_after(len(history)), translation.names.speaking():
                run = await start_chat(route, translation.chat, limits, id_prefix="resp")
        except BaseException:
            await route_scope.aclose()
            raise
        envelope = Envelope.of(body, run.submission.id, route.served_name,
                               parallel_tool_calls=parallel_calls(body, template), shows_reasoning=shown,
                               stored=storing, previous_response_id=body.previous_response_id,
                               conversation_id=conversation.id if conversation is not None else None)

        def answered(response: dict[str, Any]) -> None:
            """An answer joins its conversation: this request's input, then its output."""
            if conversation is not None and response["status"] in ("completed", "incomplete"):
                conversation.items.extend([*own, *response["output"]])

        def keep(response: dict[str, Any]) -> None:
            answered(response)
            if storing:
                store.put(StoredResponse(response=response, input_items=items))

        if body.background:
            stored = StoredResponse(response=envelope.response("in_progress", [], None), input_items=items,
                                    cancel_run=run.submission.cancel)
            stored.task = asyncio.ensure_future(_in_background(run, envelope, translation.names, stored,
                                                               route_scope, answered))
            store.put(stored)
            return JSONResponse(stored.response)

        def whole(outcomes: list[Outcome]) -> Response:
            response = whole_response(run, envelope, outcomes)
            keep(response)
            return JSONResponse(response)

        def streamed() -> AsyncIterator[str]:
            return response_events(run, envelope, translation.names, on_final=keep)

        async with route_scope:
            with translation.names.speaking():
                return await answer(run.submission, request, streamed=streamed if body.stream else None,
                                    whole=whole)

    @app.post("/v1/responses/input_tokens")
    async def input_tokens() -> None:
        raise HTTPException(404, "POST /v1/responses/input_tokens is not served; count a conversation's "
                            "tokens with POST /tokenize and its messages")

    @app.get("/v1/responses/{response_id}")
    async def get_response(response_id: str, request: Request) -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), (), "GET /v1/responses/{id}")
        return store.get(response_id).response

    @app.delete("/v1/responses/{response_id}")
    async def delete_response(response_id: str) -> dict[str, Any]:
        store.delete(response_id)
        return {"id": response_id, "object": "response", "deleted": True}

    @app.post("/v1/responses/{response_id}/cancel")
    async def cancel_response(response_id: str) -> dict[str, Any]:
        stored = store.get(response_id)
        if not stored.response.get("background"):
            raise InvalidRequest("response_id", f"{response_id} was not created with background: true; only "
                                 "a background response can be cancelled (a streamed one: close the stream)")
        if stored.running and not stored.cancelled:
            stored.cancelled = True
            stored.cancel_run()
            stored.response = {**stored.response, "status": "cancelled"}
        return stored.response

    @app.get("/v1/responses/{response_id}/input_items")
    async def list_input_items(response_id: str, request: Request, limit: int = 20,
                               order: Literal["asc", "desc"] = "desc",
                               after: str | None = None) -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), ("limit", "order", "after"),
                             "GET /v1/responses/{id}/input_items")
        items = store.get(response_id).input_items
        return page(items, after, limit, max_limit=100, order=order)
