"""What the Ray Serve tests (one node, several nodes) both read from ``/ray/replicas``."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def finished(reps: dict[str, dict]) -> int:
    """Requests the replicas have finished, over every reason."""
    return sum(sum(r["requests_finished"].values()) for r in reps.values())


def cancelled(reps: dict[str, dict]) -> int:
    return sum(r["requests_finished"].get("cancelled", 0) for r in reps.values())


def abandon_stream_and_see_cancel(client, model: str, replicas: Callable[[], dict[str, dict]],
                                  timeout: float = 30.0) -> None:
    """Read 3 chunks of a long stream, close it, and wait until a replica counts a cancel."""
    before = cancelled(replicas())
    stream = client.completions.create(model=model, prompt="Count from one to five hundred:", max_tokens=400,
                                       temperature=0, stream=True)
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        # Another request makes the replica report again (reports follow finished streams).
        client.completions.create(model=model, prompt="Hi", max_tokens=1)
        reps = replicas()
        if cancelled(reps) > before:
            return
        time.sleep(0.3)
    pytest.fail(f"no replica counted the abandoned stream as cancelled: {reps}")
