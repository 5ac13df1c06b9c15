"""The server's own background tasks (batches, background responses) end when it stops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def cancel_and_wait(tasks: Iterable[asyncio.Task | None]) -> None:
    """Cancel the tasks still running and wait until each has handled it (kept what it had done,
    cancelled its engine requests), so that the engines stop after them, not under them."""
    running = [t for t in tasks if t is not None and not t.done()]
    for task in running:
        task.cancel()
    for task in running:
        with contextlib.suppress(asyncio.CancelledError):
            await task
