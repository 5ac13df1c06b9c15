"""OpenAI's Batch API (``/v1/batches``) and the Files API it reads from and writes to (``/v1/files``).

What a client of ``client.files.create(purpose="batch")`` + ``client.batches.create(...)`` expects:
the batch is checked when it is created (a malformed line fails it with ``errors``, each naming
its line, as OpenAI's validation does), then runs in the background while the server serves,
its counts and status readable at any time, and ends with an output file (the answered lines)
and an error file (the refused ones), in OpenAI's batch output format, in input order.

The lines run through the server's own routes in-process (``batch_lane.BatchLane``), so a
batch line is answered exactly as the same request sent alone would be. All batches together
(Anthropic's Message Batches too) take at most half of the engine's running slots
(``max_num_seqs // 2``), so interactive clients keep the rest while long batches run; an earlier
batch's lines are sent first.

State lives in memory for the server's lifetime (files on disk in a temporary directory): a
restart forgets them, which docs/server.md says. Cancelling a batch cancels its requests in
flight, whose KV is freed at once; the lines answered so far are kept in its files.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Iterable
from typing import Any, Literal

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import Field

from ruvllm.errors import BatchFileError, InvalidRequest
from ruvllm.server.batches.batch_file import BATCH_URLS, output_line, parse_batch
from ruvllm.server.batches.file_store import FileStore
from ruvllm.server.http.cursor_page import page
from ruvllm.server.http.strict_fields import RequestBody, StrictModel, refuse_unknown_query
from ruvllm.server.lifecycle.batch_lane import BatchBook, BatchLane, BatchLine, LineAnswer

#: The endpoints a batch may run: OpenAI's batch endpoints this server has (a batch file's routes
#: but Anthropic's, which its own Message Batches run).
BATCH_ENDPOINTS = tuple(url for url in BATCH_URLS if url != "/v1/messages")
#: OpenAI's only completion window; a batch here finishes when it finishes, and expires never.
COMPLETION_WINDOW = "24h"
_FORM_FIELDS = frozenset({"file", "purpose", "expires_after[anchor]", "expires_after[seconds]"})


class ExpiresAfter(StrictModel):
    anchor: Literal["created_at"]
    #: OpenAI's range: an hour to thirty days.
    seconds: int = Field(ge=3600, le=2592000)


class BatchCreateRequest(RequestBody):
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str] | None = None
    output_expires_after: ExpiresAfter | None = None


@attrs.define(kw_only=True)
class BatchJob:
    """One batch: OpenAI's ``batch`` object's fields, and the task running it."""

    id: str
    endpoint: str
    input_file_id: str
    created_at: int
    metadata: dict[str, str] | None
    output_expires_after: int | None
    lines: list[BatchLine] = attrs.field(factory=list)
    status: str = "validating"
    times: dict[str, int] = attrs.field(factory=dict)
    errors: list[dict[str, Any]] | None = None
    results: dict[int, LineAnswer] = attrs.field(factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    task: asyncio.Task | None = None

    def stamp(self, status: str) -> None:
        self.status = status
        self.times[f"{status}_at"] = int(time.time())

    @property
    def model(self) -> str | None:
        models = {line.body.get("model") for line in self.lines} - {None}
        return models.pop() if len(models) == 1 else None

    def card(self) -> dict[str, Any]:
        """OpenAI's ``batch`` object."""
        failed = sum(not r.succeeded for r in self.results.values())
        stamps = {f"{s}_at": self.times.get(f"{s}_at") for s in
                  ("in_progress", "finalizing", "completed", "failed", "cancelling", "cancelled")}
        return {"id": self.id, "object": "batch", "endpoint": self.endpoint, "model": self.model,
                "errors": None if self.errors is None else {"object": "list", "data": self.errors},
                "input_file_id": self.input_file_id, "completion_window": COMPLETION_WINDOW,
                "status": self.status, "output_file_id": self.output_file_id,
                "error_file_id": self.error_file_id, "created_at": self.created_at, **stamps,
                "expires_at": None, "expired_at": None,
                "request_counts": {"total": len(self.lines), "completed": len(self.results) - failed,
                                   "failed": failed},
                "usage": batch_usage(r.body for r in self.results.values() if r.succeeded),
                "metadata": self.metadata}


def batch_usage(bodies: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The batch's token counts: the sum of its answers' (chat and completions count prompt and
    completion tokens, the Responses API input and output tokens, embeddings the input)."""
    inputs = outputs = cached = reasoning = 0
    for body in bodies:
        usage = body.get("usage") or {}
        inputs += usage.get("prompt_tokens", usage.get("input_tokens", 0))
        outputs += usage.get("completion_tokens", usage.get("output_tokens", 0))
        details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
        cached += details.get("cached_tokens", 0)
        out_details = usage.get("completion_tokens_details") or usage.get("output_tokens_details") or {}
        reasoning += out_details.get("reasoning_tokens", 0)
    return {"input_tokens": inputs, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": outputs, "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": inputs + outputs}


def _line_errors(job: BatchJob, text: str) -> list[dict[str, Any]]:
    """OpenAI's validation errors of a batch input: each malformed line (one whose url is not the
    batch's endpoint included), or the file's one problem."""
    try:
        job.lines = parse_batch(text, endpoint=job.endpoint)
    except BatchFileError as exc:
        if not exc.problems:
            return [{"code": "empty_file", "message": str(exc), "param": "input_file_id", "line": None}]
        return [{"code": "invalid_request", "message": f"line {n} {why}", "param": None, "line": n}
                for n, why in exc.problems]
    return []


class BatchService(BatchBook[BatchJob]):
    """The server's files and batches, each batch run by its own task on the shared lane."""

    def __init__(self, lane: BatchLane):
        super().__init__("batch", "GET /v1/batches")
        self.files = FileStore()
        self._lane = lane

    async def close(self) -> None:
        """Cancel the batches still running (the server is stopping) and drop the files."""
        await super().close()
        self.files.close()

    def create(self, body: BatchCreateRequest) -> BatchJob:
        if body.endpoint not in BATCH_ENDPOINTS:
            raise InvalidRequest("endpoint", f"{body.endpoint!r} is not served in batches here; use one of "
                                 f"{', '.join(BATCH_ENDPOINTS)}", body.endpoint)
        if body.completion_window != COMPLETION_WINDOW:
            raise InvalidRequest("completion_window", f"must be {COMPLETION_WINDOW!r} (OpenAI's only "
                                 f"window), got {body.completion_window!r}", body.completion_window)
        source = self.files.get(body.input_file_id)
        if source.purpose != "batch":
            raise InvalidRequest("input_file_id", f"{source.id} was uploaded with purpose "
                                 f"{source.purpose!r}; a batch reads a file uploaded with purpose \"batch\"",
                                 source.id)
        job = BatchJob(id=f"batch_{uuid.uuid4().hex}", endpoint=body.endpoint, input_file_id=source.id,
                       created_at=int(time.time()), metadata=body.metadata,
                       output_expires_after=body.output_expires_after.seconds
                       if body.output_expires_after is not None else None)
        self.batches[job.id] = job
        errors = _line_errors(job, source.path.read_text(encoding="utf-8", errors="replace"))
        if errors:
            job.errors = errors
            job.stamp("failed")
            return job
        job.stamp("in_progress")
        job.task = asyncio.ensure_future(self._run(job))
        return job

    def cancel(self, batch_id: str) -> BatchJob:
        job = self.get(batch_id)
        if job.status == "in_progress" and job.task is not None:
            job.stamp("cancelling")
            job.task.cancel()
        return job

    async def _run(self, job: BatchJob) -> None:
        try:
            await self._lane.run(job.lines, on_result=job.results.__setitem__)
            job.stamp("finalizing")
            self._write_files(job)
            job.stamp("completed")
        except asyncio.CancelledError:
            # Cancelled by the client, or the server is stopping: what was answered is kept.
            self._write_files(job)
            job.stamp("cancelled")
            raise

    def _write_files(self, job: BatchJob) -> None:
        ordered = [job.results[i] for i in sorted(job.results)]
        for ok, attribute in ((True, "output_file_id"), (False, "error_file_id")):
            chosen = [output_line(r) for r in ordered if r.succeeded == ok]
            if chosen:
                data = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in chosen).encode("utf-8")
                stored = self.files.write(data, filename=f"{job.id}_{attribute.split('_')[0]}.jsonl",
                                          expires_after=job.output_expires_after)
                setattr(job, attribute, stored.id)


async def _read_upload(request: Request, service: BatchService) -> dict[str, Any]:
    """``POST /v1/files``' multipart form, checked as strictly as a JSON body."""
    form = await request.form(max_files=1, max_fields=len(_FORM_FIELDS))
    unknown = sorted(set(form.keys()) - _FORM_FIELDS)
    if unknown:
        raise InvalidRequest(unknown[0], "is not a field of POST /v1/files (file, purpose, expires_after)")
    upload = form.get("file")
    if upload is None or isinstance(upload, str):
        raise InvalidRequest("file", "upload the file as the multipart part named file")
    purpose = form.get("purpose")
    if not isinstance(purpose, str):
        raise InvalidRequest("purpose", "is required: \"batch\" for a batch's input file")
    expires_after = None
    if "expires_after[anchor]" in form or "expires_after[seconds]" in form:
        seconds = str(form.get("expires_after[seconds]", ""))
        if form.get("expires_after[anchor]") != "created_at" or not seconds.isdigit():
            raise InvalidRequest("expires_after", "needs anchor \"created_at\" and seconds, a whole number")
        expires_after = ExpiresAfter(anchor="created_at", seconds=int(seconds)).seconds
    stored = service.files.upload(upload.file, filename=upload.filename or "upload.jsonl", purpose=purpose,
                                  expires_after=expires_after)
    return stored.card()


def register_batch_routes(app: FastAPI, lane: BatchLane) -> BatchService:
    """The Files and Batch API routes; the caller closes the returned service when the server stops."""
    service = BatchService(lane)

    @app.post("/v1/files")
    async def upload_file(request: Request) -> dict[str, Any]:
        return await _read_upload(request, service)

    @app.get("/v1/files")
    async def list_files(request: Request, purpose: str | None = None, limit: int = 10000,
                         order: Literal["asc", "desc"] = "desc", after: str | None = None) -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), ("purpose", "limit", "order", "after"), "/v1/files")
        cards = [f.card() for f in service.files.listing(purpose=purpose, newest_first=order == "desc")]
        return page(cards, after, limit)

    @app.get("/v1/files/{file_id}")
    async def get_file(file_id: str) -> dict[str, Any]:
        return service.files.get(file_id).card()

    @app.get("/v1/files/{file_id}/content")
    async def file_content(file_id: str) -> Response:
        return Response(service.files.content(file_id), media_type="application/octet-stream")

    @app.delete("/v1/files/{file_id}")
    async def delete_file(file_id: str) -> dict[str, Any]:
        service.files.delete(file_id)
        return {"id": file_id, "object": "file", "deleted": True}

    @app.post("/v1/batches")
    async def create_batch(body: BatchCreateRequest) -> dict[str, Any]:
        return service.create(body).card()

    @app.get("/v1/batches")
    async def list_batches(request: Request, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), ("limit", "after"), "/v1/batches")
        return page([job.card() for job in reversed(service.batches.values())], after, limit)

    @app.get("/v1/batches/{batch_id}")
    async def get_batch(batch_id: str) -> dict[str, Any]:
        return service.get(batch_id).card()

    @app.post("/v1/batches/{batch_id}/cancel")
    async def cancel_batch(batch_id: str) -> dict[str, Any]:
        return service.cancel(batch_id).card()

    return service
