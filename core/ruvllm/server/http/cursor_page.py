"""OpenAI's cursor pages (``after``, ``limit``, ``first_id``, ``last_id``, ``has_more``): the one
shape every list endpoint of the stored objects answers in (files, batches, a response's input
items)."""

from __future__ import annotations

from typing import Any

from ruvllm.errors import InvalidRequest


def page(objects: list[dict[str, Any]], after: str | None, limit: int, *, max_limit: int = 10000,
         order: str = "asc") -> dict[str, Any]:
    """The ``limit`` objects after the one whose id is ``after`` (from the start without it);
    ``order="desc"`` pages ``objects`` from the last."""
    if order == "desc":
        objects = objects[::-1]
    if not 1 <= limit <= max_limit:
        raise InvalidRequest("limit", f"must be between 1 and {max_limit}, got {limit}", limit)
    ids = [o["id"] for o in objects]
    if after is not None and after not in ids:
        raise InvalidRequest("after", f"{after!r} is not in this list; pass the last id of the previous page",
                             after)
    start = ids.index(after) + 1 if after is not None else 0
    data = objects[start:start + limit]
    return {"object": "list", "data": data, "first_id": data[0]["id"] if data else None,
            "last_id": data[-1]["id"] if data else None, "has_more": start + limit < len(objects)}
