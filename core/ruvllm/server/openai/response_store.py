"""The Responses API's stored responses: what ``previous_response_id``, ``GET /v1/responses/{id}``,
its ``input_items`` and ``background: true`` need.

OpenAI keeps every response (``store`` defaults to true) so that a client can continue a
conversation by id instead of sending it again, and fetch a background response later. Here they
are kept in memory, the newest ``capacity`` of them (``[server] stored_responses``); the oldest is
forgotten first, and a restart forgets all (a 404 says so). A stored response holds everything
its model was given (the earlier turns a ``previous_response_id`` brought included, the
``instructions`` not: OpenAI does not carry them over either) and its output, so the next turn
is that plus its own input.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs
from pydantic import BaseModel

from ruvllm.server.lifecycle.background import cancel_and_wait
from ruvllm.server.openai.newest_kept import NewestKept

_ITEM_ID_PREFIX = {"message": "msg", "function_call": "fc", "function_call_output": "fco", "reasoning": "rs"}


def dumped(items: Sequence[BaseModel]) -> list[dict[str, Any]]:
    """Parsed input items as the JSON the client sent (the API's field names, unset ones left out)."""
    return [item.model_dump(by_alias=True, exclude_none=True) for item in items]


def with_ids(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Input items as OpenAI lists them: each with an id, a message's text as a content part (an
    answer's with its ``annotations``) and its status."""
    out = []
    for item in items:
        item = dict(item)
        kind = item.setdefault("type", "message")
        if kind == "message" and isinstance(item.get("content"), str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            item["content"] = [{"type": part, "text": item["content"]}]
        if kind == "message":
            item.setdefault("status", "completed")
            item["content"] = [{"annotations": [], **part} if part.get("type") == "output_text" else part
                               for part in item["content"]]
        item.setdefault("id", f"{_ITEM_ID_PREFIX.get(kind, 'item')}_{uuid.uuid4().hex}")
        out.append(item)
    return out


@attrs.define(kw_only=True)
class StoredResponse:
    #: The response object as a client fetches it (a background one's changes as it runs).
    response: dict[str, Any]
    #: Everything the model was given, oldest first, each with an id.
    input_items: list[dict[str, Any]]
    #: A background response's run, and what cancels its engine requests.
    task: asyncio.Task | None = None
    cancel_run: Callable[[], None] = lambda: None
    cancelled: bool = False

    @property
    def id(self) -> str:
        return self.response["id"]

    @property
    def running(self) -> bool:
        return self.task is not None and not self.task.done()

    def conversation(self) -> list[dict[str, Any]]:
        """What a response continuing this one starts from: its input, then its output."""
        return [*self.input_items, *self.response["output"]]


class ResponseStore:
    """The newest ``capacity`` responses by id (0: none are kept); a background response that is
    forgotten or deleted while it runs is cancelled."""

    def __init__(self, capacity: int):
        self._kept: NewestKept[StoredResponse] = NewestKept(
            capacity, kind="response", setting="stored_responses",
            advice="send the conversation's items in input")

    @property
    def capacity(self) -> int:
        return self._kept.capacity

    def put(self, stored: StoredResponse) -> None:
        for forgotten in self._kept.put(stored.id, stored):
            _stop(forgotten)

    def get(self, response_id: str) -> StoredResponse:
        return self._kept.get(response_id)

    def delete(self, response_id: str) -> None:
        _stop(self._kept.delete(response_id))

    def item(self, item_id: str) -> dict[str, Any] | None:
        """The item with this id in a kept response's input or output (the newest holding it)."""
        for stored in reversed(self._kept.values()):
            found = next((i for i in stored.conversation() if i.get("id") == item_id), None)
            if found is not None:
                return found
        return None

    async def close(self) -> None:
        """Cancel the background responses still running (the server is stopping)."""
        await cancel_and_wait(s.task for s in self._kept.values())


def _stop(stored: StoredResponse) -> None:
    if stored.task is not None:
        stored.task.cancel()
