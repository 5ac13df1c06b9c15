"""A chat run's outputs as the Responses API's ``response`` object and its stream of typed events.

The output items are the lifecycle's events (:mod:`ruvllm.server.lifecycle.answer_events`), so thinking,
text and tool calls are read out of the model's answer exactly as for ``/v1/chat/completions``: a
thinking model's thinking as a ``reasoning`` item with one ``reasoning_text`` part (its
``summary`` empty: nothing is summarised), a ``message`` item with one ``output_text`` part
(present unless the answer is only calls), then a ``function_call`` item per call. Both the
whole response and the stream's last event are built by :func:`_items`, so a stream always ends
with the response that the same request answers whole.

The stream is the event sequence the ``openai`` SDK's ``responses.stream`` helper accumulates:
``response.created``, ``response.in_progress``; for the thinking ``response.output_item.added``,
``response.content_part.added``, ``response.reasoning_text.delta``...,
``response.reasoning_text.done``, ``response.content_part.done``, ``response.output_item.done``
(all before the answer, as the model writes them); for the text ``response.output_item.added``,
``response.content_part.added``, ``response.output_text.delta``..., ``response.output_text.done``,
``response.content_part.done``, ``response.output_item.done``; for each call
``response.output_item.added``, ``response.function_call_arguments.delta`` / ``.done`` (a call is
known whole only once the answer finished, so its arguments come in one delta),
``response.output_item.done``; then ``response.completed``, or ``response.incomplete`` when
``max_output_tokens`` cut the answer. Every event is named (``event:``) and numbered
(``sequence_number``); a failure after the start is an ``error`` event and ``response.failed``.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import attrs

from ruvllm.errors import RuvllmError
from ruvllm.guided.tools import ToolCall
from ruvllm.reasoning import Reasoning
from ruvllm.server.http.errors import ruvllm_error_body
from ruvllm.server.http.field_names import FieldNames, in_terms
from ruvllm.server.http.sse import named_sse_event
from ruvllm.server.lifecycle.chat_run import ChatRun
from ruvllm.server.lifecycle.completion_service import Arrival, Outcome
from ruvllm.server.lifecycle.events import Event, Finish, Step, logprob_entry
from ruvllm.server.openai.responses_schema import FunctionChoice, ResponsesRequest
from ruvllm.types import GenerationResult, TokenOutput


def usage(input_tokens: int, result: GenerationResult, reasoning_tokens: int = 0) -> dict[str, Any]:
    """The engine's token counts: ``cached_tokens`` are the input tokens read from the prefix cache;
    ``cache_write_tokens`` (which OpenAI's schema requires) is 0, as Anthropic's
    ``cache_creation_input_tokens`` is: the prefix cache keeps blocks without being asked."""
    output_tokens = result.usage.completion_tokens
    return {"input_tokens": input_tokens,
            "input_tokens_details": {"cached_tokens": result.usage.cached_prompt_tokens,
                                     "cache_write_tokens": 0},
            "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
            "total_tokens": input_tokens + output_tokens}


class ReasoningTokens:
    """Counts the answer's reasoning tokens: the tokens a thinking model wrote before its answer
    began (its think tags included), all of them when it never closed its thinking; 0 when the
    output had no thinking block. The same count for a whole and a streamed response."""

    def __init__(self, reasoning: Reasoning | None):
        self._splitter = reasoning.splitter() if reasoning is not None else None
        self._answering = False
        self._tokens = 0

    def add(self, out: TokenOutput) -> None:
        if self._splitter is None or self._answering:
            return
        if self._splitter.feed(out.text)[1]:
            self._answering = True
        elif out.token_id is not None:
            self._tokens += 1

    @property
    def count(self) -> int:
        return self._tokens if self._splitter is not None and self._splitter.thinks else 0

    @classmethod
    def of(cls, reasoning: Reasoning | None, outputs: Sequence[TokenOutput]) -> int:
        counter = cls(reasoning)
        for out in outputs:
            counter.add(out)
        return counter.count


def _status(finish_reason: str) -> str:
    return "incomplete" if finish_reason == "length" else "completed"


@attrs.frozen
class Envelope:
    """What every ``response`` object of one request carries besides its output: its id, the
    model, and the request's settings echoed back (the SDK's ``Response`` type requires
    ``tools``, ``tool_choice`` and ``parallel_tool_calls``; ``store`` says whether it is kept)."""

    id: str
    model: str
    created_at: int
    echo: dict[str, Any]
    #: Whether a thinking model's thinking is returned, as a ``reasoning`` item.
    shows_reasoning: bool = False

    @classmethod
    def of(cls, body: ResponsesRequest, response_id: str, model: str, *, parallel_tool_calls: bool,
           shows_reasoning: bool = False, stored: bool = False,
           previous_response_id: str | None = None, conversation_id: str | None = None) -> Envelope:
        """``stored``: whether the response is kept (``store`` echoes it); ``previous_response_id``
        or ``conversation_id``: what this one continues."""
        text_format = body.text.format if body.text is not None else None
        choice = body.tool_choice
        echo = {
            "instructions": body.instructions, "max_output_tokens": body.max_output_tokens,
            "metadata": body.metadata or {}, "parallel_tool_calls": parallel_tool_calls,
            "previous_response_id": previous_response_id, "background": bool(body.background),
            "conversation": {"id": conversation_id} if conversation_id is not None else None,
            "store": stored,
            "reasoning": {"effort": body.reasoning.effort if body.reasoning else None, "summary": None},
            "temperature": 1.0 if body.temperature is None else body.temperature,
            "top_p": 1.0 if body.top_p is None else body.top_p, "top_logprobs": body.top_logprobs,
            "text": {"format": text_format.model_dump(by_alias=True, exclude_none=True) if text_format
                     else {"type": "text"}},
            "tool_choice": choice.model_dump() if isinstance(choice, FunctionChoice) else choice or "auto",
            "tools": [t.model_dump() for t in body.tools or []],
            "truncation": "disabled", "user": body.user,
        }
        return cls(response_id, model, int(time.time()), echo, shows_reasoning)

    @property
    def message_id(self) -> str:
        return "msg_" + self.id.split("-", 1)[-1]

    @property
    def reasoning_id(self) -> str:
        return "rs_" + self.id.split("-", 1)[-1]

    def reasoning(self, text: str, status: str) -> dict[str, Any]:
        return {"id": self.reasoning_id, "type": "reasoning", "summary": [], "status": status,
                "content": [_reasoning_part(text)]}

    def response(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None,
                 error: dict[str, str] | None = None) -> dict[str, Any]:
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": error, "model": self.model, "output": output, "usage": usage,
                "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
                **self.echo}

    def message(self, text: str, logprobs: list[dict[str, Any]], status: str) -> dict[str, Any]:
        return {"id": self.message_id, "type": "message", "role": "assistant", "status": status,
                "content": [_text_part(text, logprobs)]}


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def _text_part(text: str, logprobs: list[dict[str, Any]]) -> dict[str, Any]:
    # Chat's logprobs entries (token, logprob, bytes, top_logprobs) are the Responses API's too.
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs}


def _function_call(call: ToolCall) -> dict[str, Any]:
    """A call as a ``function_call`` item: this API sends its arguments as JSON text."""
    return {"id": "fc_" + call.id.removeprefix("call_"), "type": "function_call", "call_id": call.id,
            "name": call.name, "arguments": json.dumps(call.arguments, ensure_ascii=False),
            "status": "completed"}


def _items(envelope: Envelope, thinking: str | None, text: str | None, logprobs: list[dict[str, Any]],
           calls: Sequence[ToolCall], finish_reason: str) -> list[dict[str, Any]]:
    """The output items of a finished answer: its thinking as a reasoning item (when there is any
    and it is shown; incomplete only when the answer was cut before it began), its text as a
    message (also when it is empty, unless the answer is only calls), then its calls."""
    items = []
    if thinking and envelope.shows_reasoning:
        items.append(envelope.reasoning(thinking, "completed" if text or calls else _status(finish_reason)))
    if text or not calls:
        items.append(envelope.message(text or "", logprobs, _status(finish_reason)))
    return items + [_function_call(c) for c in calls]


def whole_response(run: ChatRun, envelope: Envelope, outcomes: list[Outcome]) -> dict[str, Any]:
    outputs, result = outcomes[0]
    answer = run.reading.whole(outputs, result)
    logprobs = [logprob_entry(t) for t in answer.logprobs or ()]
    reason = answer.finish.reason
    output = _items(envelope, answer.reasoning, answer.text, logprobs, answer.calls, reason)
    reasoning_tokens = ReasoningTokens.of(run.reading.reasoning, outputs)
    return envelope.response(_status(reason), output, usage(len(run.prompt_ids), result, reasoning_tokens))


class _Events:
    """The events of one streamed response, numbered as they are made."""

    def __init__(self, envelope: Envelope, input_tokens: int, reasoning: Reasoning | None, names: FieldNames,
                 on_final: Callable[[dict[str, Any]], None] | None):
        self.envelope = envelope
        #: The chat request's fields in this API's names, for a failure's event.
        self.names = names
        #: The answer's tool calls, known at its finish.
        self.calls: list[ToolCall] = []
        self.on_final = on_final
        self.input_tokens = input_tokens
        self.sequence = 0
        self.message_open = False
        self.text = ""
        self.thinking = ""
        #: The reasoning item: not yet added (None), open (True) or done (False).
        self.reasoning_open: bool | None = None
        self.reasoning_tokens = ReasoningTokens(reasoning)
        #: Every logprobs entry so far, and those not yet sent with a delta.
        self.logprobs: list[dict[str, Any]] = []
        self.unsent: list[dict[str, Any]] = []

    @property
    def message_index(self) -> int:
        return 0 if self.reasoning_open is None else 1

    def event(self, kind: str, **fields: Any) -> str:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return named_sse_event(kind, payload)

    def _in_text(self, kind: str, **fields: Any) -> str:
        return self.event(kind, item_id=self.envelope.message_id, output_index=self.message_index,
                          content_index=0, **fields)

    def _in_reasoning(self, kind: str, **fields: Any) -> str:
        return self.event(kind, item_id=self.envelope.reasoning_id, output_index=0, content_index=0, **fields)

    def opening(self) -> str:
        started = self.envelope.response("in_progress", [], None)
        return self.event("response.created", response=started) + self.event("response.in_progress",
                                                                             response=started)

    def _think(self, text: str) -> list[str]:
        out = []
        if self.reasoning_open is None:
            self.reasoning_open = True
            item = {**self.envelope.reasoning("", "in_progress"), "content": []}
            out += [self.event("response.output_item.added", output_index=0, item=item),
                    self._in_reasoning("response.content_part.added", part=_reasoning_part(""))]
        self.thinking += text
        out.append(self._in_reasoning("response.reasoning_text.delta", delta=text))
        return out

    def _close_reasoning(self, item: dict[str, Any]) -> list[str]:
        if not self.reasoning_open:
            return []
        self.reasoning_open = False
        return [self._in_reasoning("response.reasoning_text.done", text=self.thinking),
                self._in_reasoning("response.content_part.done", part=_reasoning_part(self.thinking)),
                self.event("response.output_item.done", output_index=0, item=item)]

    def _open_message(self) -> list[str]:
        out = self._close_reasoning(self.envelope.reasoning(self.thinking, "completed"))
        self.message_open = True
        item = {**self.envelope.message("", [], "in_progress"), "content": []}
        return [*out, self.event("response.output_item.added", output_index=self.message_index, item=item),
                self._in_text("response.content_part.added", part=_text_part("", []))]

    def render(self, events: list[Event]) -> list[str]:
        """The stream events of one step's events: its thinking (when shown) and its text as
        deltas (logprobs entries ride with the next text sent: a held tool call's tokens have
        entries and no text yet), then, at the finish, every item done and the response."""
        step = Step.of(events)
        entries = [logprob_entry(t) for t in step.logprobs]
        self.logprobs += entries
        self.unsent += entries
        out = self._think(step.thinking) if step.thinking and self.envelope.shows_reasoning else []
        if step.text:
            out += self._text(step.text)
        self.calls += step.calls
        if step.finish is not None:
            out += self.finish(step.finish)
        if step.failed is not None:
            out += self.failure(step.failed.error)
        return out

    def _text(self, text: str) -> list[str]:
        out = [] if self.message_open else self._open_message()
        self.text += text
        out.append(self._in_text("response.output_text.delta", delta=text, logprobs=self.unsent))
        self.unsent = []
        return out

    def finish(self, finish: Finish) -> list[str]:
        out: list[str] = []
        items = _items(self.envelope, self.thinking, self.text, self.logprobs, self.calls, finish.reason)
        for index, item in enumerate(items):
            if item["type"] == "reasoning":
                out += self._close_reasoning(item)  # done already if the answer began
                continue
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
        status = _status(finish.reason)
        response = self.envelope.response(status, items, usage(self.input_tokens, finish.result,
                                                              self.reasoning_tokens.count))
        out.append(self.event("response.completed" if status == "completed" else "response.incomplete",
                              response=response))
        self._final(response)
        return out

    def _final(self, response: dict[str, Any]) -> None:
        if self.on_final is not None:
            self.on_final(response)

    def failure(self, exc: RuvllmError) -> list[str]:
        """An ``error`` event (:func:`stream_error`), then the response as failed."""
        error = stream_error(exc, self.names)
        failed = self.envelope.response("failed", [], None,
                                        {"code": "server_error", "message": error["message"]})
        self._final(failed)
        return [self.event("error", code=error["code"], message=error["message"], param=error["param"]),
                self.event("response.failed", response=failed)]


def stream_error(exc: RuvllmError, names: FieldNames) -> dict[str, Any]:
    """A failure after the stream started, in OpenAI's error fields naming the field the client
    sent (``names``: this API's table): this surface's one shape of an error inside a stream."""
    return ruvllm_error_body(in_terms(exc, names))[1]["error"]


def response_events(run: ChatRun, envelope: Envelope, names: FieldNames, *,
                    on_final: Callable[[dict[str, Any]], None] | None = None) -> AsyncIterator[str]:
    """The SSE body of a streamed response; the events ready together share one write, and a
    refusal's event names the field in this API's ``names``. ``on_final`` gets the response as
    its last event carries it (to store it)."""
    events = _Events(envelope, len(run.prompt_ids), run.reading.reasoning, names, on_final)
    choice = run.reading.choice()

    def render(item: Arrival) -> list[str]:
        if isinstance(item, TokenOutput):
            events.reasoning_tokens.add(item)
        return events.render(choice.of(item))

    return run.submission.writes(render, first=events.opening())
