"""Server-sent events for streamed completions.

The body iterator is always closed when the response ends, whether the stream finished, the
client went away or the server is shutting down: closing it is what cancels the engine request
(and frees its KV blocks), so it must never be left to the garbage collector. A body that never
started (the client left before the first write) runs no ``finally`` when closed, which is why
the response also takes the callback that cancels the requests themselves.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

from starlette.responses import StreamingResponse

DONE = "data: [DONE]\n\n"

# One encoder for every event: json.dumps with options builds a new JSONEncoder on each call.
_encode = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode


def sse_event(payload: dict[str, Any]) -> str:
    return f"data: {_encode(payload)}\n\n"


def named_sse_event(name: str, payload: dict[str, Any]) -> str:
    """An event with an ``event:`` line (Anthropic's stream names every event)."""
    return f"event: {name}\ndata: {_encode(payload)}\n\n"


class SSEResponse(StreamingResponse):
    media_type = "text/event-stream"

    def __init__(self, events: AsyncIterator[str], *, on_close: Callable[[], None] | None = None):
        super().__init__(events, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._events = events
        self._on_close = on_close

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            try:
                aclose = getattr(self._events, "aclose", None)
                if aclose is not None:
                    await aclose()
            finally:
                if self._on_close is not None:
                    self._on_close()
