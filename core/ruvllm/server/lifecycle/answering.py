"""How any surface answers a submitted request: its stream, or the whole answer, or 499.

Every API surface gives its client one of three things once the choices run: the stream it
asked for (whose closing cancels what has not finished), the whole answer once every choice
finished (the client's connection polled meanwhile), or, when the client left before that, a
499 and nothing else. What differs is only how each surface writes a stream and a whole answer,
so that is all a surface passes in: the whole answer made of every choice's outcome, or, where a
surface's whole answer is read from its own stream of objects (llama-server's, which ends at the
first error), the coroutine that reads it.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from fastapi import Request
from fastapi.responses import Response

from ruvllm.server.http.sse import SSEResponse
from ruvllm.server.lifecycle.completion_service import Outcome, Submission

#: The status of an answer nobody is there to read (nginx's "client closed request").
CLIENT_GONE = 499


async def answer(submission: Submission, request: Request, *,
                 streamed: Callable[[], AsyncIterator[str]] | None,
                 whole: Callable[[list[Outcome]], Response] | None = None,
                 read_whole: Callable[[], Awaitable[Response]] | None = None,
                 stream_class: type[SSEResponse] = SSEResponse) -> Response:
    """``streamed()``'s stream (in ``stream_class``: SSE, or Ollama's NDJSON) when the client asked
    for one (``streamed`` not None), else the whole answer: ``whole`` of every choice's outcome, or
    what ``read_whole()`` makes of the submission (give one of the two); a 499 when the client left
    first (every choice then cancelled)."""
    if (whole is None) == (read_whole is None):
        raise TypeError("answer() takes one of whole and read_whole")
    if streamed is not None:
        return stream_class(streamed(), on_close=submission.cancel)
    if read_whole is not None:
        answered = await submission.unless_gone(read_whole(), request.is_disconnected)
    else:
        outcomes = await submission.results(request.is_disconnected)
        answered = None if outcomes is None else whole(outcomes)  # type: ignore[misc]
    return Response(status_code=CLIENT_GONE) if answered is None else answered
