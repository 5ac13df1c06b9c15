"""The ServingEngine: continuous batching over an iteration-level executor.

``ServingEngine(backend, EngineOptions(...))`` or ``ServingEngine.from_config(config)``; see
docs/engine.md for the architecture (queue -> scheduler -> executor step -> sampler -> outputs).
"""

from ruvllm.engine.block_manager import BlockManager, PrefixHit
from ruvllm.engine.engine import ServingEngine
from ruvllm.engine.handles import RequestHandle, SyncRequestHandle
from ruvllm.engine.options import EngineOptions
from ruvllm.engine.request import Priority, RequestState, SchedRequest
from ruvllm.engine.scheduler import Policy, Scheduler, SchedulerConfig, StepPlan

# The engine's errors live in ruvllm.errors with every other; re-exported here because
# ``from ruvllm.engine import RequestTimedOut`` (and EngineClosed, EngineOptionError) is public.
from ruvllm.errors import EngineClosed, EngineOptionError, RequestTimedOut

__all__ = [
    "BlockManager",
    "EngineClosed",
    "EngineOptionError",
    "EngineOptions",
    "Policy",
    "PrefixHit",
    "Priority",
    "RequestHandle",
    "RequestState",
    "RequestTimedOut",
    "SchedRequest",
    "Scheduler",
    "SchedulerConfig",
    "ServingEngine",
    "StepPlan",
    "SyncRequestHandle",
]
