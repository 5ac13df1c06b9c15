"""``POST /v1/feedback``: a user's score for a completion, for a learning plugin (SONA) to learn from.

Body: ``{"id": "<completion id>", "score": <number in [-1, 1]>, "index": <choice, default 0>}``.
The id is the ``id`` of a chat/completion response (``chatcmpl-...``/``cmpl-...``); ``index``
picks the choice when ``n > 1``. 400 for a bad body or score, 404 for an id no learning
plugin holds (unknown, evicted, or SONA is not enabled).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import FastAPI
from pydantic import StrictFloat, StrictInt

from ruvllm.errors import FeedbackNotFound
from ruvllm.feedback import check_score
from ruvllm.server.http.strict_fields import RequestBody


class FeedbackRequest(RequestBody):

    id: str
    score: StrictFloat | StrictInt
    index: StrictInt = 0


def register_feedback(app: FastAPI, send: Callable[[str, float], Awaitable[None] | None]) -> None:
    """``send(request_id, score)``: one engine's ``AsyncEngine.feedback``, or for a pool of
    models ``ruvllm.feedback.send_feedback`` (their engines share the plugin registry's hooks).
    An awaitable it returns (a remote engine's delivery) is awaited."""

    @app.post("/v1/feedback")
    async def feedback(body: FeedbackRequest) -> dict[str, Any]:
        score = check_score(body.score)
        # Engine request ids are "<completion id>-<choice index>"; plain engine ids work too.
        for request_id in (f"{body.id}-{body.index}", body.id):
            try:
                sent = send(request_id, score)
                if inspect.isawaitable(sent):
                    await sent
            except FeedbackNotFound:
                continue
            return {"id": body.id, "index": body.index, "score": score, "status": "recorded"}
        raise FeedbackNotFound(f"no finished completion {body.id!r} (choice {body.index}) is waiting for "
                               "feedback: unknown id, too old, or SONA is not enabled on this server")
