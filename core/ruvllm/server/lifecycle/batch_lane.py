"""The lane every batch API runs its lines through: the server's own routes, in-process.

OpenAI's Batch API (and ``ruvllm run-batch``) and Anthropic's Message Batches differ in how a
batch is created, listed and reported, not in how a line is answered: each line is sent to this
server's route for its URL through the ASGI app, so it gets exactly the validation, defaults,
templates and answer shape a client of ``ruvllm serve`` gets, and its answer is kept as a
:class:`LineAnswer` (the route's status and body, or why there is none), which each batch surface
writes in its own terms (OpenAI's output line: :mod:`ruvllm.server.batches.batch_file`;
Anthropic's result: :mod:`ruvllm.server.anthropic.message_batches_api`). A line's 503 (a model
still loading) is retried after its ``Retry-After``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar

import attrs

from ruvllm.errors import InvalidRequest, StoredObjectNotFound
from ruvllm.server.http.errors import ruvllm_error_body, surface_body
from ruvllm.server.lifecycle.background import cancel_and_wait

if TYPE_CHECKING:
    import httpx

#: Times a line answered 503 is sent again before its 503 stands.
_OVERLOAD_RETRIES = 5


@attrs.frozen
class BatchLine:
    """One request of a batch; ``number`` is its place in the batch (from 1), for messages."""

    number: int
    custom_id: str
    url: str
    body: dict[str, Any]


@attrs.frozen
class LineAnswer:
    """What one batch line was answered, in no API's shape."""

    custom_id: str
    #: The status the line's route answered; None where no answer exists (the in-process call
    #: itself failed, ``failure`` says how).
    status: int | None
    #: The route's JSON body (the answer, or the error in the line's own API's shape).
    body: Any = None
    failure: str | None = None

    @property
    def succeeded(self) -> bool:
        """Whether the route answered the line (not an error status, nor no answer at all)."""
        return self.status is not None and self.status < 400


def _sent(line: BatchLine) -> dict[str, Any]:
    """The body a line is sent with: a Responses line is not stored unless it asks to be (its
    answer is in the output already, and a large batch would push every interactive client's
    stored response out of the store)."""
    if line.url == "/v1/responses" and "store" not in line.body:
        return {**line.body, "store": False}
    return line.body


async def _answer(client: httpx.AsyncClient, line: BatchLine) -> LineAnswer:
    import httpx

    for field in ("stream", "background"):
        if line.body.get(field):
            exc = InvalidRequest(field, f"a batch line is answered whole; leave {field} out or false")
            status, body, _ = ruvllm_error_body(exc)
            return LineAnswer(line.custom_id, status, surface_body(line.url, status, body))
    try:
        for attempt in range(_OVERLOAD_RETRIES + 1):
            response = await client.post(line.url, json=_sent(line))
            if response.status_code != 503 or attempt == _OVERLOAD_RETRIES:
                break
            await asyncio.sleep(float(response.headers.get("retry-after", "1")))
        return LineAnswer(line.custom_id, response.status_code, response.json())
    except (httpx.HTTPError, ValueError) as exc:
        return LineAnswer(line.custom_id, None, failure=f"{type(exc).__name__}: {exc}")


class BatchLane:
    """Where batch lines run: through an app in-process, at most ``window`` at once over every
    batch sent through the lane (the server's share of the engine for OpenAI's Batch API and
    Anthropic's Message Batches together, so that interactive clients keep the rest); earlier
    lines go first."""

    def __init__(self, app: Any, *, api_key: str | None, window: int):
        self._app = app
        self._headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self._gate = asyncio.Semaphore(window)

    async def run(self, lines: list[BatchLine], on_result: Callable[[int, LineAnswer], None]) -> None:
        """Send every line, ``on_result(index, its answer)`` as each is answered. Cancelling the
        caller cancels the lines in flight."""
        # Imported by the first batch, not by every server: httpx imports its command line's
        # rich and pygments with it (~10 MB resident that a server with no batch never uses).
        import httpx

        transport = httpx.ASGITransport(app=self._app)
        async with httpx.AsyncClient(transport=transport, base_url="http://ruvllm-batch",
                                     headers=self._headers, timeout=None) as client:

            async def one(index: int, line: BatchLine) -> None:
                async with self._gate:
                    result = await _answer(client, line)
                on_result(index, result)

            await asyncio.gather(*(one(i, line) for i, line in enumerate(lines)))


class _Running(Protocol):
    task: asyncio.Task | None


B = TypeVar("B", bound=_Running)


class BatchBook(Generic[B]):
    """One batch API's batches by id, oldest first: what both batch services keep the same way.

    A batch id the server does not have is a 404 naming where this API lists its batches; the
    batches still running are cancelled, and waited for, when the server stops."""

    def __init__(self, kind: str, listing: str):
        self.batches: dict[str, B] = {}
        self._kind = kind
        self._listing = listing

    def get(self, batch_id: str) -> B:
        batch = self.batches.get(batch_id)
        if batch is None:
            raise StoredObjectNotFound(self._kind, batch_id, f"{self._listing} lists this server's batches")
        return batch

    async def close(self) -> None:
        """Cancel the batches still running (the server is stopping)."""
        await cancel_and_wait(b.task for b in self.batches.values())
