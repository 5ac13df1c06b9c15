"""OpenAI's batch file format, run through this server's own routes in-process (``ruvllm run-batch``).

Each input line is ``{"custom_id", "method": "POST", "url", "body"}``; each output line, in the
input's order, is ``{"id", "custom_id", "response": {"status_code", "request_id", "body"},
"error"}``, as OpenAI's Batch API and vLLM's ``run-batch`` write it. A request the server refuses
keeps its HTTP answer (``status_code`` 400 and the error ``body``), as OpenAI reports it;
``error`` is set only where no HTTP answer exists.

The lines run through the server's own routes in-process (:mod:`ruvllm.server.lifecycle.batch_lane`,
the lane Anthropic's Message Batches share), concurrently, so the engine batches them, within a
window that keeps the engine's queue from overflowing.

A malformed file (not JSON, a missing or repeated ``custom_id``, a method or URL the format does
not have) is refused whole before anything runs, naming its lines, as OpenAI validates an input
file before its batch starts.
"""

from __future__ import annotations

import json
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import attrs

from ruvllm.errors import BatchFileError
from ruvllm.server.lifecycle.batch_lane import BatchLane, BatchLine, LineAnswer

#: The routes a batch line may name: OpenAI's batch endpoints this server has, and Anthropic's
#: Messages API (whose answers keep their own shape).
BATCH_URLS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/messages")
_LINE_KEYS = frozenset({"custom_id", "method", "url", "body"})


@attrs.frozen
class BatchSummary:
    total: int
    succeeded: int

    @property
    def failed(self) -> int:
        return self.total - self.succeeded


def _is_url(location: str) -> bool:
    return location.startswith(("http://", "https://"))


def read_text(source: str) -> str:
    """The input file's text: a local path, ``-`` (standard input), or an http(s) URL fetched
    with GET (where vLLM's and OpenAI's batch files often live)."""
    if source == "-":
        return sys.stdin.read()
    if _is_url(source):
        import httpx  # only for a batch file at a URL (batch_lane.BatchLane.run says why)

        try:
            response = httpx.get(source, follow_redirects=True, timeout=60)
            response.raise_for_status()
        except httpx.HTTPError as exc:
            raise BatchFileError(f"cannot read the batch input {source}: {exc}") from None
        return response.text
    path = Path(source).expanduser()
    if not path.is_file():
        raise BatchFileError(f"batch input {source} does not exist; give a JSONL file, '-' or an http(s) URL")
    return path.read_text(encoding="utf-8")


def _line_problem(data: Any, endpoint: str | None) -> str | None:
    if not isinstance(data, dict):
        return "is not a JSON object"
    unknown = sorted(set(data) - _LINE_KEYS)
    if unknown:
        return f"has unknown key {unknown[0]!r} (a line has custom_id, method, url and body)"
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "needs custom_id, a non-empty string that names its output line"
    if data.get("method") != "POST":
        return f"method must be \"POST\", got {data.get('method')!r}"
    if endpoint is not None and data.get("url") != endpoint:
        return f"has url {data.get('url')!r}, but its batch runs {endpoint} (one endpoint per batch)"
    if data.get("url") not in BATCH_URLS:
        return f"url {data.get('url')!r} is not one of {', '.join(BATCH_URLS)}"
    if not isinstance(data.get("body"), dict):
        return "needs body, the request's JSON object"
    return None


def parse_batch(text: str, *, endpoint: str | None = None) -> list[BatchLine]:
    """The requests of a batch file's ``text`` (blank lines skipped); every problem of the file in
    one :class:`BatchFileError` (``problems``: each line's number and what is wrong), or none.
    ``endpoint``: the one URL every line must have (OpenAI's Batch API runs one per batch)."""
    lines: list[BatchLine] = []
    problems: list[tuple[int, str]] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            problems.append((number, f"is not JSON ({exc.msg}, column {exc.colno})"))
            continue
        problem = _line_problem(data, endpoint)
        if problem is None and data["custom_id"] in seen:
            problem = f"repeats custom_id {data['custom_id']!r} of line {seen[data['custom_id']]}"
        if problem is not None:
            problems.append((number, problem))
            continue
        seen[data["custom_id"]] = number
        lines.append(BatchLine(number=number, custom_id=data["custom_id"], url=data["url"],
                               body=data["body"]))
    if problems:
        raise BatchFileError.malformed(problems)
    if not lines:
        raise BatchFileError("the batch input has no requests; write one JSON object per line ("
                             '{"custom_id": ..., "method": "POST", "url": "/v1/chat/completions", '
                             '"body": {...}})')
    return lines


class _OrderedWriter:
    """Writes results in input order as soon as every earlier one is in, so a long batch's output
    grows while it runs and holds only the results that finished ahead of an earlier line."""

    def __init__(self, out: TextIO):
        self._out = out
        self._next = 0
        self._ready: dict[int, dict[str, Any]] = {}

    def add(self, index: int, result: dict[str, Any]) -> None:
        self._ready[index] = result
        while self._next in self._ready:
            self._out.write(json.dumps(self._ready.pop(self._next), ensure_ascii=False) + "\n")
            self._next += 1
        self._out.flush()


def output_line(answer: LineAnswer) -> dict[str, Any]:
    """A line's answer as OpenAI's batch output line (``{"id", "custom_id", "response":
    {"status_code", "request_id", "body"}, "error"}``; ``response`` null and ``error`` set where
    the line got no answer at all)."""
    line_id = f"batch_req_{uuid.uuid4().hex}"
    if answer.status is None:
        return {"id": line_id, "custom_id": answer.custom_id, "response": None,
                "error": {"code": "batch_request_failed", "message": answer.failure}}
    body = answer.body
    request_id = body.get("id") if isinstance(body, dict) and isinstance(body.get("id"), str) else None
    return {"id": line_id, "custom_id": answer.custom_id,
            "response": {"status_code": answer.status, "request_id": request_id or f"req_{uuid.uuid4().hex}",
                         "body": body},
            "error": None}


async def run_lines(app: Any, lines: list[BatchLine], out: TextIO, *, window: int,
                    progress: Callable[[int, int], None] | None = None) -> BatchSummary:
    """Run ``lines`` through ``app`` (started and stopped here, as a server would), at most
    ``window`` at once, writing each result to ``out`` in input order."""
    writer = _OrderedWriter(out)
    done = answered = 0

    def on_result(index: int, answer: LineAnswer) -> None:
        nonlocal done, answered
        writer.add(index, output_line(answer))
        done += 1
        answered += answer.succeeded
        if progress is not None:
            progress(done, len(lines))

    async with app.router.lifespan_context(app):
        await BatchLane(app, api_key=None, window=window).run(lines, on_result)
    return BatchSummary(total=len(lines), succeeded=answered)


def check_output(target: str) -> None:
    """Refuse an output path that cannot be written, before a model loads and a batch runs."""
    if target == "-" or _is_url(target):
        return
    path = Path(target).expanduser()
    if not path.parent.is_dir():
        raise BatchFileError(f"cannot write the batch output {target}: {path.parent} is not a directory")
    if path.is_dir():
        raise BatchFileError(f"cannot write the batch output {target}: it is a directory; name a file")


def write_output(target: str, produce: Callable[[TextIO], BatchSummary]) -> BatchSummary:
    """Run ``produce`` into ``target``: a local path (written while the batch runs), ``-``
    (standard output) or an http(s) URL, which gets the whole file with PUT at the end."""
    if target == "-":
        return produce(sys.stdout)
    check_output(target)
    if not _is_url(target):
        with Path(target).expanduser().open("w", encoding="utf-8") as out:
            return produce(out)
    # Named and kept if the upload fails, so that a finished batch's results are never lost.
    with tempfile.NamedTemporaryFile("w+", encoding="utf-8", suffix=".jsonl", prefix="ruvllm-batch-",
                                     delete=False) as out:
        summary = produce(out)
    kept = Path(out.name)
    import httpx  # only for an output at a URL (batch_lane.BatchLane.run says why)

    try:
        httpx.put(target, content=kept.read_bytes(), headers={"content-type": "application/jsonl"},
                  timeout=300).raise_for_status()
    except httpx.HTTPError as exc:
        raise BatchFileError(f"the batch ran, but uploading its output to {target} failed ({exc}); "
                             f"the output is in {kept}") from None
    kept.unlink()
    return summary
