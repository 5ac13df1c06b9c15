"""User feedback on finished requests, delivered to the learning plugins (e.g. SONA).

``send_feedback(request_id, score)`` validates the score and hands it to the
``ruvllm_feedback`` hook; an id no plugin knows (never served, evicted, or no learning
plugin attached) is :class:`~ruvllm.errors.FeedbackNotFound` (HTTP 404), a bad score is
InvalidRequest (400).
"""

from __future__ import annotations

import math
from typing import Any

from ruvllm.errors import FeedbackNotFound, InvalidRequest


def check_score(score: Any) -> float:
    if isinstance(score, bool) or not isinstance(score, (int, float)) or math.isnan(score) \
            or not -1.0 <= score <= 1.0:
        raise InvalidRequest("score", f"must be a number in [-1, 1] (1 = good, -1 = bad), got {score!r}",
                             score)
    return float(score)


def send_feedback(request_id: str, score: float, *, hooks: Any = None) -> None:
    """Record ``score`` for the finished request ``request_id``."""
    if not isinstance(request_id, str) or not request_id:
        raise InvalidRequest("id", f"must be the id of a finished request, got {request_id!r}", request_id)
    score = check_score(score)
    if hooks is None:
        from ruvllm.plugins import get_registry

        hooks = get_registry().pm.hook
    if not hooks.ruvllm_feedback(request_id=request_id, score=score):
        raise FeedbackNotFound(
            f"no finished request {request_id!r} is waiting for feedback (unknown id, too old, or no "
            "learning plugin is attached to the engine: enable [sona])"
        )
