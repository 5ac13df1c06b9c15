"""Every request body is JSON, whatever content type the client declared.

``curl -d '{...}'`` declares ``application/x-www-form-urlencoded``, and a browser's or
Node's ``fetch`` with a string body declares ``text/plain``: Ollama's and llama-server's own
documentation send their examples that way, and both servers read the body as JSON. FastAPI
would not parse such a body and answer a 400 saying it is not an object; this server has no
urlencoded-form or text endpoint (its one upload, ``POST /v1/files``, is a multipart form, left
as it is), so those two types are read as the JSON they are. A body that is not JSON
is then a 400 saying so, naming where it broke.
"""

from __future__ import annotations

#: Content types clients send a JSON body under without meaning another format.
_READ_AS_JSON = (b"application/x-www-form-urlencoded", b"text/plain")


class JsonBodiesMiddleware:
    """Declares a form or plain-text body ``application/json`` before the routes parse it."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope.get("method") == "POST":
            headers = scope.get("headers") or []
            declared = next((v for k, v in headers if k == b"content-type"), b"")
            if declared.split(b";", 1)[0].strip().lower() in _READ_AS_JSON:
                headers = [(k, b"application/json" if k == b"content-type" else v) for k, v in headers]
                scope = {**scope, "headers": headers}
        await self.app(scope, receive, send)
