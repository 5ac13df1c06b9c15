"""Serves the chat page's static files, in front of authentication and routing.

The files hold no server data (every figure the page shows comes from authenticated API calls
made by its script), so anyone may load them, as anyone may load llama-server's page; serving
them here, before the API-key middleware, keeps ``limits.PUBLIC_PATHS`` the API's own list.

``/`` answers both a browser and Ollama's client: a browser asks for ``text/html`` and gets the
page, Ollama's CLI and libraries do not and get Ollama's ``Ollama is running`` from its route.
"""

from __future__ import annotations

from importlib import resources
from pathlib import PurePosixPath

from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

#: Scripts only from the page's own files, so nothing in model output can run even if a bug
#: ever put it into the DOM as markup; no inline script or style, no other origin at all.
CONTENT_SECURITY_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                           "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
          ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
#: The page's address under ``/ui``; ``/`` is the same page for a browser.
PREFIX = "/ui"


def _files() -> dict[str, tuple[bytes, str]]:
    """Path -> (body, content type) of every static file, read once: the page is a few tens of KB."""
    static = resources.files(__package__).joinpath("static")
    files: dict[str, tuple[bytes, str]] = {}
    for item in static.iterdir():
        suffix = PurePosixPath(item.name).suffix
        if item.is_file() and suffix in _TYPES:
            files[f"{PREFIX}/{item.name}"] = (item.read_bytes(), _TYPES[suffix])
    index = files[f"{PREFIX}/index.html"]
    files[PREFIX] = files[f"{PREFIX}/"] = index
    return files


def _wants_html(scope: Scope) -> bool:
    """A browser navigating asks for ``text/html``; Ollama's clients send no such Accept."""
    return "text/html" in Headers(scope=scope).get("accept", "")


class ChatPageMiddleware:
    """Answers ``GET``/``HEAD`` of the page's files; everything else goes on to the app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.files = _files()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] in ("GET", "HEAD"):
            path = scope["path"]
            if path == "/" and _wants_html(scope):
                path = PREFIX
            found = self.files.get(path)
            if found is not None:
                body, media_type = found
                await Response(body, media_type=media_type, headers={
                    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
                    "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer",
                    # A new version of the page must reach the browser at the next load.
                    "Cache-Control": "no-cache",
                    # The same address answers a browser and Ollama's client differently.
                    "Vary": "Accept",
                })(scope, receive, send)
                return
        await self.app(scope, receive, send)


def page_url(host: str, port: int) -> str:
    """The address to open in a browser on this machine: a wildcard bind is reached on loopback."""
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(host, host)
    if ":" in shown and not shown.startswith("["):
        shown = f"[{shown}]"
    return f"http://{shown}:{port}/"
