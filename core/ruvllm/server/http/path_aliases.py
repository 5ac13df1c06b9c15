"""llama-server's other paths for routes this server already has.

Clients pointed at a llama-server base URL without ``/v1`` (the ``openai`` SDK with
``base_url="http://host:8080"``, editor plugins, curl lines from llama.cpp's docs) send
``/chat/completions``, ``/responses``, ``/models``, ``/v1/health`` or ``/completions``, and
llama-server answers each as its canonical route. Here they are rewritten to that route before
anything else sees the request, so authentication, body limits, validation, errors and metrics
are the canonical route's, and the published schema lists each route once.
"""

from __future__ import annotations

#: alias -> the route that answers it, as llama-server maps them (``/completions`` is its own
#: ``/completion``, not OpenAI's ``/v1/completions``).
ALIASES = {
    "/chat/completions": "/v1/chat/completions",
    "/responses": "/v1/responses",
    "/models": "/v1/models",
    "/v1/health": "/health",
    "/completions": "/completion",
}


class PathAliasesMiddleware:
    """Rewrites an alias path to its route's (the outermost middleware)."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] in ALIASES:
            path = ALIASES[scope["path"]]
            scope = {**scope, "path": path, "raw_path": path.encode()}
        await self.app(scope, receive, send)
