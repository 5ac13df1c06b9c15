"""Cursor pages: OpenAI's (``after``, ``limit``, ``first_id``, ``last_id``, ``has_more``), the one
shape every list endpoint of its stored objects answers in (files, batches, a response's input
items), and the window Anthropic's pages (``after_id`` or ``before_id``) cut the same way."""

from __future__ import annotations

from typing import Any

from ruvllm.errors import InvalidRequest


def check_limit(limit: int, max_limit: int) -> None:
    """Refuse a page size outside 1 to ``max_limit`` (each list has its API's own bound)."""
    if not 1 <= limit <= max_limit:
        raise InvalidRequest("limit", f"must be between 1 and {max_limit}, got {limit}", limit)


def window(count: int, limit: int, *, after: int | None = None,
           before: int | None = None) -> tuple[int, int, bool]:
    """The positions ``[start, end)`` of the ``limit`` objects after position ``after`` (from the
    first without it) or before position ``before``, and whether more lie beyond them that way."""
    if before is not None:
        start = max(0, before - limit)
        return start, before, start > 0
    start = after + 1 if after is not None else 0
    return start, min(count, start + limit), start + limit < count


def ends(data: list[dict[str, Any]]) -> dict[str, str | None]:
    """A page's ``first_id`` and ``last_id``."""
    return {"first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None}


def page(objects: list[dict[str, Any]], after: str | None, limit: int, *, max_limit: int = 10000,
         order: str = "asc") -> dict[str, Any]:
    """The ``limit`` objects after the one whose id is ``after`` (from the start without it);
    ``order="desc"`` pages ``objects`` from the last."""
    if order == "desc":
        objects = objects[::-1]
    check_limit(limit, max_limit)
    ids = [o["id"] for o in objects]
    if after is not None and after not in ids:
        raise InvalidRequest("after", f"{after!r} is not in this list; pass the last id of the previous page",
                             after)
    start, end, more = window(len(objects), limit, after=ids.index(after) if after is not None else None)
    data = objects[start:end]
    return {"object": "list", "data": data, **ends(data), "has_more": more}
