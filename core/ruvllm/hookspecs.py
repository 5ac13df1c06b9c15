"""Hook specifications: how plugins extend ruvllm.

Backends register through :func:`ruvllm_register_backends` (the shape simonw/llm uses for
models). The SONA hooks describe the three learning loops; core calls them, and the default
SONA plugin implements them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ruvllm.backend import LlmBackend
    from ruvllm.types import Trajectory

PROJECT = "ruvllm"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def ruvllm_register_backends(register: Callable[[type[LlmBackend]], None]) -> None:
    """Call ``register(BackendClass)`` for every backend this plugin provides, or
    ``register(LazyBackend(name, "module:Class", ...))`` when importing the class's module would
    import its engine: discovery runs in every ruvllm process (see ruvllm.lazy_backend)."""


@hookspec
def ruvllm_register_commands(cli: Any) -> None:
    """Add subcommands to the ``ruvllm`` click group (``cli``), as simonw/llm plugins do."""


@hookspec
def ruvllm_engine_started(engine: Any, config: Any) -> None:
    """A ServingEngine built by ``ServingEngine.from_config`` is ready; ``config`` is the
    :class:`ruvllm.config.Config` it came from. Plugins acting on a running engine (SONA)
    attach here when their config section enables them."""


@hookspec
def ruvllm_sona_instant(engine: Any, trajectory: Trajectory) -> None:
    """Instant loop: called on the engine's model thread for every request that finished with
    a result (``trajectory.feedback`` is None: feedback arrives later, by
    :func:`ruvllm_sona_feedback`).

    Must cost well under a millisecond: record, never train or run the model, here.
    """


@hookspec(firstresult=True)
def ruvllm_sona_feedback(request_id: str, score: float) -> bool | None:
    """A user's score in [-1, 1] for a finished request (the id the engine or the server's
    completion gave). Return True when the id was known and the score recorded."""


@hookspec
def ruvllm_sona_background(engine: Any) -> None:
    """Background loop: run off the serving path (the plugin's own thread, or on demand) to
    turn buffered feedback into adapter updates; new adapter versions are published with
    ``engine.publish`` so the swap happens between engine steps."""


@hookspec
def ruvllm_sona_deep(engine: Any, reason: str) -> None:
    """Deep loop: consolidate adapters and patterns; triggered by accumulated feedback or on
    demand (``reason`` says which)."""


@hookspec(firstresult=True)
def ruvllm_select_adapter(engine: Any, prompt_ids: tuple[int, ...], embedding: Any) -> str | None:
    """Name the adapter a new request (submitted without one) should run with, or None for
    the base model. Called at submit time on the caller's thread; ``embedding`` is None when
    the caller has none (the implementation computes what it needs)."""
