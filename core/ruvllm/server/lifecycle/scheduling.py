"""vLLM's ``priority`` and ``cache_salt`` request fields, as keyword arguments of ``engine.submit``.

``priority`` keeps vLLM's meaning (a LOWER value is served earlier) so clients written for vLLM
behave the same; the engine's own scale is the opposite (higher runs first), hence the sign
flip. As in vLLM, a non-zero priority is refused unless the engine schedules by priority:
otherwise it would be silently ignored.
"""

from __future__ import annotations

from typing import Any

from ruvllm.errors import InvalidRequest
from ruvllm.serving import AsyncEngine


def priority_scheduling(engine: AsyncEngine) -> bool:
    return engine.scheduling_policy == "priority"


def submit_options(priority: int, cache_salt: str | None, engine: AsyncEngine) -> dict[str, Any]:
    policy = engine.scheduling_policy
    if priority and policy != "priority":
        raise InvalidRequest(
            "priority", f"got {priority}, but this server schedules by {policy}, not "
            "by priority; start it with [engine] policy = \"priority\" or leave priority at 0", priority)
    return {"priority": -priority, "cache_salt": cache_salt}
