"""A chat run's outputs as the Responses API's ``response`` object and its stream of typed events.

The output items come from the chat formatter (:mod:`ruvllm.server.tool_responses`), so text and
tool calls are read out of the model's answer exactly as for ``/v1/chat/completions``: a
``message`` item with one ``output_text`` part (present unless the answer is only calls), then a
``function_call`` item per call. Both the whole response and the stream's last event are built
by :func:`_items`, so a stream always ends with the response that the same request answers whole.

The stream is the event sequence the ``openai`` SDK's ``responses.stream`` helper accumulates:
``response.created``, ``response.in_progress``; for the text ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``; for each call
``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done`` (a call is
known whole only once the answer finished, so its arguments come in one delta),
``response.output_item.done``; then ``response.completed``, or ``response.incomplete`` when
``max_output_tokens`` cut the answer. Every event is named (``event:``) and numbered
(``sequence_number``); a failure after the start is an ``error`` event and ``response.failed``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs

from ruvllm.errors import RuvllmError
from ruvllm.server.chat_run import ChatRun
from ruvllm.server.completion_service import Outcome
from ruvllm.server.errors import ruvllm_error_body
from ruvllm.server.responses import ChatFormatter
from ruvllm.server.responses_schema import FunctionChoice, ResponsesRequest
from ruvllm.server.sse import named_sse_event
from ruvllm.types import GenerationResult, TokenOutput


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    """The engine's token counts. ``cached_tokens`` is 0: the engine does not report a request's
    prefix-cache hits (``/metrics`` counts the server's); no token is a reasoning token."""
    return {"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": input_tokens + output_tokens}


def _status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


@attrs.frozen
class Envelope:
    """What every ``response`` object of one request carries besides its output: its id, the
    model, and the request's settings echoed back (the SDK's ``Response`` type requires
    ``tools``, ``tool_choice`` and ``parallel_tool_calls``; ``store: false`` says nothing was kept)."""

    id: str
    model: str
    created_at: int
    echo: dict[str, Any]

    @classmethod
    def of(cls, body: ResponsesRequest, response_id: str, model: str, *,
           parallel_tool_calls: bool) -> Envelope:
        text_format = body.text.format if body.text is not None else None
        choice = body.tool_choice
        echo = {
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {}, "parallel_tool_calls": parallel_tool_calls,
            "previous_response_id": None, "background": False, "store": False,
            "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p, "top_logprobs": body.top_logprobs,
            "text": {"format": text_format.model_dump(by_alias=True, exclude_none=True) if text_format
                     else {"type": "text"}},
            "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else choice or "auto",
            "tools": [t.model_dump() for t in body.tools or []],
            "truncation": "disabled", "user": body.user,
        }
        return cls(response_id, model, int(time.time()), echo)

    @property
    def message_id(self) -> str:
        return "msg_" + self.id.split("-", 1)[-1]

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                 error: dict[str, str] | None = None) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": error, "model": self.model, "output": output, "usage": usage,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                **self.echo}

    def message(self, text: str, logprobs: list[dict[str, Any]], status: str) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant", "status": status,
                "content": [_text_part(text, logprobs)]}


def _text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    # Chat's logprobs entries (token, logprob, bytes, top_logprobs) are the Responses API's too.
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _function_call(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {"id": "fc_" + call["id"].removeprefix("call_"), "type": "function_call", "call_id": call["id"],
            "name": function["name"], "arguments": function["arguments"], "status": "completed"}


def _items(envelope: Envelope, text: str | None, logprobs: list[dict[str, Any]],
           calls: Sequence[dict[str, Any]], finish_reason: str) -> list[dict[str, Any]]:
    """The output items of a finished answer: its text as a message (also when it is empty, unless
    the answer is only calls), then its calls."""
    items = [envelope.message(text or "", logprobs, _status(finish_reason))] if text or not calls else []
    return items + [_function_call(c) for c in calls]


def whole_response(run: ChatRun, envelope: Envelope, outcomes: list[Outcome]) -> dict[str, Any]:
    choice = run.formatter.complete(outcomes, [len(run.prompt_ids)])["choices"][0]
    message = choice["message"]
    logprobs = (choice["logprobs"] or {}).get("content") or []
    output = _items(envelope, message["content"], logprobs, message.get("tool_calls") or [],
                    choice["finish_reason"])
    return envelope.response(_status(choice["finish_reason"]), output,
                             usage(len(run.prompt_ids), outcomes[0][1].usage.completion_tokens))


class _Events:
    """The events of one streamed response, numbered as they are made."""

    def __init__(self, envelope: Envelope, input_tokens: int):
        self.envelope = envelope
        self.input_tokens = input_tokens
        self.sequence = 0
        self.message_open = False
        self.text = ""
        #: Every logprobs entry so far, and those not yet sent with a delta.
        self.logprobs: list[dict[str, Any]] = []
        self.unsent: list[dict[str, Any]] = []

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return named_sse_event(kind, payload)

    def _in_text(self, kind: str, **fields: Any) -> str:
        return self.event(kind, item_id=self.envelope.message_id, output_index=0, content_index=0, **fields)

    def opening(self) -> str:
        started = self.envelope.response("in_progress", [], None)
        return self.event("response.created", response=started) + self.event("response.in_progress",
                                                                             response=started)

    def _open_message(self) -> list[str]:
        self.message_open = True
        item = {**self.envelope.message("", [], "in_progress"), "content": []}
        return [self.event("response.output_item.added", output_index=0, item=item),
                self._in_text("response.content_part.added", part=_text_part("", []))]

    def chunk(self, chunk: dict[str, Any] | None) -> list[str]:
        """The events of one chat chunk: its text as a delta (logprobs entries ride with the next
        text sent; a held tool call's tokens have entries and no text yet)."""
        if chunk is None:
            return []
        choice = chunk["choices"][0]
        entries = (choice["logprobs"] or {}).get("content") or []
        self.logprobs += entries
        self.unsent += entries
        text = choice["delta"].get("content")
        if not text:
            return []
        out = [] if self.message_open else self._open_message()
        self.text += text
        out.append(self._in_text("response.output_text.delta", delta=text, logprobs=self.unsent))
        self.unsent = []
        return out

    def finish(self, formatter: ChatFormatter, result: GenerationResult) -> list[str]:
        last = formatter.finish(0, result.finish_reason.value)
        out = self.chunk(last)
        choice = last["choices"][0]
        items = _items(self.envelope, self.text, self.logprobs, choice["delta"].get("tool_calls") or [],
                       choice["finish_reason"])
        for index, item in enumerate(items):
            if item["type"] == "message":
                if not self.message_open:
                    out += self._open_message()
                out += [self._in_text("response.output_text.done", text=self.text, logprobs=self.logprobs),
                        self._in_text("response.content_part.done", part=item["content"][0])]
            else:
                at = {"item_id": item["id"], "output_index": index}
                out += [self.event("response.output_item.added", output_index=index,
                                   item={**item, "arguments": "", "status": "in_progress"}),
                        self.event("response.function_call_arguments.delta", **at, delta=item["arguments"]),
                        self.event("response.function_call_arguments.done", **at,
                                   arguments=item["arguments"])]
            out.append(self.event("response.output_item.done", output_index=index, item=item))
        status = _status(choice["finish_reason"])
        response = self.envelope.response(status, items, usage(self.input_tokens,
                                                                result.usage.completion_tokens))
        out.append(self.event("response.completed" if status == "completed" else "response.incomplete",
                              response=response))
        return out

    def failure(self, exc: RuvllmError) -> list[str]:
        """An ``error`` event in OpenAI's error fields, then the response as failed."""
        error = ruvllm_error_body(exc)[1]["error"]
        failed = self.envelope.response("failed", [], None,
                                        {"code": "server_error", "message": error["message"]})
        return [self.event("error", code=error["code"], message=error["message"], param=error["param"]),
                self.event("response.failed", response=failed)]


async def response_events(run: ChatRun, envelope: Envelope) -> AsyncIterator[str]:
    """The SSE body of a streamed response; the events ready together share one write."""
    events = _Events(envelope, len(run.prompt_ids))
    batches = run.submission.stream()
    try:
        yield events.opening()
        async for batch in batches:
            out: list[str] = []
            for _, item in batch.items:
                if isinstance(item, TokenOutput):
                    out += events.chunk(run.formatter.token(0, item))
                elif isinstance(item, GenerationResult):
                    out += events.finish(run.formatter, item)
                else:
                    out += events.failure(item)
            if out:
                yield "".join(out)
            if batch.last:
                break
    finally:
        await batches.aclose()
