"""Anthropic's Message Batches API (``/v1/messages/batches``), as ``client.messages.batches`` uses it.

A batch is its requests inline (``custom_id`` + the ``params`` of a Messages request); it runs in
the background through the server's own ``POST /v1/messages`` in-process (``BatchLane``, shared
with OpenAI's Batch API: batches together hold at most their share of the engine), and its
results are a JSONL stream, one ``{"custom_id", "result"}`` per request in request order:
``succeeded`` with the message, ``errored`` with the error Anthropic's API would have answered
(``params`` are checked when a request runs, as Anthropic checks them), or ``canceled``.
Anthropic's rules otherwise: ``processing_status`` ``in_progress`` -> (``canceling``) -> ``ended``,
results only once ended, delete only once ended, timestamps in RFC 3339. Kept in memory for the
server's lifetime, as the Batch API's batches are.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import uuid
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import Field

from ruvllm.errors import InvalidRequest
from ruvllm.server.http.cursor_page import check_limit, ends, window
from ruvllm.server.http.strict_fields import RequestBody, StrictModel, refuse_unknown_query
from ruvllm.server.lifecycle.batch_lane import BatchBook, BatchLane, BatchLine, LineAnswer

#: How long Anthropic gives a batch; here it only dates ``expires_at`` (a batch ends when its
#: requests are answered, and none expires).
_EXPIRY = datetime.timedelta(hours=24)


class BatchRequest(StrictModel):
    custom_id: str = Field(pattern=r"^[a-zA-Z0-9_-]{1,64}$")
    #: A Messages request's body, checked when it runs (an error is that request's result).
    params: dict[str, Any]


class MessageBatchCreate(RequestBody):
    requests: list[BatchRequest] = Field(min_length=1, max_length=100_000)


def _rfc3339(moment: datetime.datetime | None) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


@attrs.define(kw_only=True)
class MessageBatch:
    id: str
    lines: list[BatchLine]
    created_at: datetime.datetime = attrs.field(factory=_now)
    ended_at: datetime.datetime | None = None
    cancel_initiated_at: datetime.datetime | None = None
    results: dict[int, LineAnswer] = attrs.field(factory=dict)
    task: asyncio.Task | None = None

    @property
    def status(self) -> str:
        if self.ended_at is not None:
            return "ended"
        return "canceling" if self.cancel_initiated_at is not None else "in_progress"

    def result(self, index: int) -> dict[str, Any]:
        """Request ``index``'s result in Anthropic's terms."""
        line = self.lines[index]
        outcome = self.results.get(index)
        if outcome is None:
            result: dict[str, Any] = {"type": "canceled"}
        elif outcome.succeeded:
            result = {"type": "succeeded", "message": outcome.body}
        elif outcome.status is not None:
            result = {"type": "errored", "error": outcome.body}
        else:
            result = {"type": "errored", "error": {"type": "error", "error": {
                "type": "api_error", "message": outcome.failure}}}
        return {"custom_id": line.custom_id, "result": result}

    def card(self) -> dict[str, Any]:
        """Anthropic's ``message_batch`` object."""
        kinds = [self.result(i)["result"]["type"] for i in self.results]
        ended = self.ended_at is not None
        return {"id": self.id, "type": "message_batch", "processing_status": self.status,
                "request_counts": {"processing": 0 if ended else len(self.lines) - len(self.results),
                                   "succeeded": kinds.count("succeeded"), "errored": kinds.count("errored"),
                                   "canceled": len(self.lines) - len(self.results) if ended else 0,
                                   "expired": 0},
                "created_at": _rfc3339(self.created_at), "expires_at": _rfc3339(self.created_at + _EXPIRY),
                "ended_at": _rfc3339(self.ended_at),
                "cancel_initiated_at": _rfc3339(self.cancel_initiated_at), "archived_at": None,
                "results_url": f"/v1/messages/batches/{self.id}/results" if ended else None}


class MessageBatchService(BatchBook[MessageBatch]):
    """The server's message batches, each run as a task on the shared lane."""

    def __init__(self, lane: BatchLane):
        super().__init__("message batch", "GET /v1/messages/batches")
        self._lane = lane

    def create(self, body: MessageBatchCreate) -> MessageBatch:
        seen: dict[str, int] = {}
        for i, request in enumerate(body.requests):
            if request.custom_id in seen:
                raise InvalidRequest(f"requests[{i}].custom_id", f"{request.custom_id!r} is also "
                                     f"requests[{seen[request.custom_id]}]'s; each request needs its own")
            seen[request.custom_id] = i
        lines = [BatchLine(number=i + 1, custom_id=r.custom_id, url="/v1/messages", body=r.params)
                 for i, r in enumerate(body.requests)]
        batch = MessageBatch(id=f"msgbatch_{uuid.uuid4().hex}", lines=lines)
        self.batches[batch.id] = batch
        batch.task = asyncio.ensure_future(self._run(batch))
        return batch

    async def _run(self, batch: MessageBatch) -> None:
        try:
            await self._lane.run(batch.lines, on_result=batch.results.__setitem__)
        finally:
            # Ended whole, cancelled by the client, or the server is stopping: what ran is kept.
            batch.ended_at = _now()

    def ended(self, batch_id: str, doing: str) -> MessageBatch:
        batch = self.get(batch_id)
        if batch.ended_at is None:
            raise InvalidRequest("message_batch_id", f"{batch_id} is {batch.status}; {doing} once it has "
                                 "ended (cancel it to end it sooner)")
        return batch

    def cancel(self, batch_id: str) -> MessageBatch:
        batch = self.get(batch_id)
        if batch.ended_at is None and batch.cancel_initiated_at is None and batch.task is not None:
            batch.cancel_initiated_at = _now()
            batch.task.cancel()
        return batch


def _page(batches: list[MessageBatch], after_id: str | None, before_id: str | None,
          limit: int) -> dict[str, Any]:
    """Anthropic's page: newest first, ``limit`` (1-1000) after ``after_id`` or before ``before_id``."""
    check_limit(limit, 1000)
    if after_id is not None and before_id is not None:
        raise InvalidRequest("before_id", "give after_id or before_id, not both")
    ids = [b.id for b in batches]
    for name, cursor in (("after_id", after_id), ("before_id", before_id)):
        if cursor is not None and cursor not in ids:
            raise InvalidRequest(name, f"{cursor!r} is not in this list; pass an id of a page you were sent")
    start, end, more = window(len(ids), limit, after=ids.index(after_id) if after_id is not None else None,
                              before=ids.index(before_id) if before_id is not None else None)
    data = [b.card() for b in batches[start:end]]
    return {"data": data, "has_more": more, **ends(data)}


def register_message_batch_routes(app: FastAPI, lane: BatchLane) -> MessageBatchService:
    """Anthropic's Message Batches routes; the caller closes the returned service when the server stops."""
    service = MessageBatchService(lane)

    @app.post("/v1/messages/batches")
    async def create_batch(body: MessageBatchCreate) -> dict[str, Any]:
        return service.create(body).card()

    @app.get("/v1/messages/batches")
    async def list_batches(request: Request, limit: int = 20, after_id: str | None = None,
                           before_id: str | None = None) -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), ("limit", "after_id", "before_id"),
                             "GET /v1/messages/batches")
        return _page(list(reversed(service.batches.values())), after_id, before_id, limit)

    @app.get("/v1/messages/batches/{message_batch_id}")
    async def get_batch(message_batch_id: str) -> dict[str, Any]:
        return service.get(message_batch_id).card()

    @app.post("/v1/messages/batches/{message_batch_id}/cancel")
    async def cancel_batch(message_batch_id: str) -> dict[str, Any]:
        return service.cancel(message_batch_id).card()

    @app.get("/v1/messages/batches/{message_batch_id}/results")
    async def batch_results(message_batch_id: str) -> Response:
        batch = service.ended(message_batch_id, "its results can be read")
        text = "".join(json.dumps(batch.result(i), ensure_ascii=False) + "\n"
                       for i in range(len(batch.lines)))
        return Response(text, media_type="application/x-jsonl")

    @app.delete("/v1/messages/batches/{message_batch_id}")
    async def delete_batch(message_batch_id: str) -> dict[str, Any]:
        service.ended(message_batch_id, "it can be deleted")
        del service.batches[message_batch_id]
        return {"id": message_batch_id, "type": "message_batch_deleted"}

    return service
