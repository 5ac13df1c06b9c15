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
    """Call ``register(BackendClass)`` for every backend this plugin provides."""


@hookspec
def ruvllm_register_commands(cli: Any) -> None:
    """Add subcommands to the ``ruvllm`` click group (``cli``), as simonw/llm plugins do."""


@hookspec
def ruvllm_sona_instant(trajectory: Trajectory) -> None:
    """Instant loop: called on the serving path for every finished request.

    Must cost well under a millisecond: record, never train, here.
    """


@hookspec
def ruvllm_sona_background(backend: LlmBackend) -> None:
    """Background loop: called periodically off the serving path to turn buffered feedback
    into adapter updates. Adapter swaps are applied between engine steps."""


@hookspec
def ruvllm_sona_deep(backend: LlmBackend, reason: str) -> None:
    """Deep loop: consolidate adapters and patterns; triggered by accumulated feedback or on
    demand (``reason`` says which)."""


@hookspec(firstresult=True)
def ruvllm_select_adapter(prompt_ids: tuple[int, ...], embedding: Any) -> str | None:
    """Name the adapter a new request should run with, or None for the base model."""
