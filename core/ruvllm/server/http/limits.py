"""ASGI middleware that refuses oversized bodies and missing API keys before any parsing.

Checking here, not in the route, means a 100 MB body is never read into memory and an
unauthenticated client learns nothing about the model or the request schema.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Iterable, Mapping

from starlette.exceptions import HTTPException as StarletteHTTPException

from ruvllm.server.http.errors import error_body, surface_body

#: Paths anyone may read: liveness probes (``/`` is Ollama's, "Ollama is running") and the
#: Prometheus scraper. ``/health`` answers an unauthenticated client with liveness only; its
#: details need the key (see :func:`authorized`).
PUBLIC_PATHS = ("/", "/health", "/metrics")


def authorized(headers: Mapping[bytes, bytes], api_key: str | None) -> bool:
    """Whether raw ASGI ``headers`` carry ``api_key`` (``Authorization: Bearer`` or ``X-API-Key``);
    always true when the server has no key. The one check of the key, used by the middleware for
    every protected path and by ``/health`` to decide whether to show its details."""
    if not api_key:
        return True
    auth = headers.get(b"authorization", b"").decode("latin-1")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() != "bearer":
        token = headers.get(b"x-api-key", b"").decode("latin-1")
    return bool(token) and hmac.compare_digest(token.strip().encode(), api_key.encode())


async def _send_error(send, path: str, status: int, message: str, type_: str, code: str,
                      headers: Iterable[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(surface_body(path, status, error_body(message, type_, code=code))).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *headers]})
    await send({"type": "http.response.body", "body": body})


#: The POST routes whose body is a batch's input, limited by ``max_file_bytes``.
BATCH_INPUT_PATHS = frozenset({"/v1/files", "/v1/messages/batches"})


class RequestLimitsMiddleware:
    def __init__(self, app, *, max_body_bytes: int, max_file_bytes: int, api_key: str | None):
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_file_bytes = max_file_bytes
        self.api_key = api_key

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or ())
        if scope["path"] not in PUBLIC_PATHS and not authorized(headers, self.api_key):
            await _send_error(send, scope["path"], 401,
                              "invalid or missing API key: send 'Authorization: Bearer <key>'",
                              "authentication_error", "invalid_api_key",
                              [(b"www-authenticate", b"Bearer")])
            return
        declared = headers.get(b"content-length")
        # A batch's input (a file upload, or Anthropic's batch of requests) has its own, larger limit.
        upload = scope["path"] in BATCH_INPUT_PATHS and scope.get("method") == "POST"
        limit, setting = (self.max_file_bytes, "max_file_bytes") if upload else (self.max_body_bytes,
                                                                                  "max_body_bytes")
        too_large = f"request body is larger than this server's limit of {limit} bytes ([server] {setting})"
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _send_error(send, scope["path"], 413, too_large, "invalid_request_error",
                              "request_too_large")
            return
        received = 0

        async def counting_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # A chunked body without Content-Length: raised inside the route while it
                    # reads the body, so FastAPI's handlers answer 413 in the usual shape.
                    raise StarletteHTTPException(413, too_large)
            return message

        await self.app(scope, counting_receive, send)
