"""Hook specifications: how plugins extend ruvllm.

Backends register through :func:`ruvllm_register_backends` (the shape simonw/llm uses for
models). The other hooks are named for what happens in core, not for the plugin that listens:
a request finished (:func:`ruvllm_request_finished`), a user scored one (:func:`ruvllm_feedback`),
there is time for deferred work (:func:`ruvllm_step_idle`), a request needs an adapter
(:func:`ruvllm_select_adapter`), someone reads the engine's metrics (:func:`ruvllm_engine_metrics`).
Learning plugins (SONA) implement them; core never names one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from ruvllm.backend import LlmBackend
    from ruvllm.serving import PluginMetric
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
def ruvllm_request_finished(engine: Any, trajectory: Trajectory) -> None:
    """A request of ``engine`` finished with a result: called on the engine's model thread, for
    every such request, before its caller sees the result (so feedback sent right after finds
    it). ``trajectory.feedback`` is None: feedback arrives later, by :func:`ruvllm_feedback`.

    Must cost well under a millisecond: record, never train or run the model, here. An exception
    is logged and does not reach the request.
    """


@hookspec(firstresult=True)
def ruvllm_feedback(request_id: str, score: float) -> bool | None:
    """A user's score in [-1, 1] for a finished request (the id the engine or the server's
    completion gave; see :mod:`ruvllm.feedback`). Return True when the id was known and the score
    recorded, None to leave it to other plugins."""


@hookspec
def ruvllm_step_idle(engine: Any) -> None:
    """Run deferred work for ``engine`` now, off the serving path: on the caller's thread (a
    plugin's own timer, a test, a benchmark), never the model thread. Learning plugins turn the
    feedback they buffered into adapter updates here and publish them with ``engine.publish`` so
    the swap happens between two engine steps. Core's serving path does not call it."""


@hookspec(firstresult=True)
def ruvllm_select_adapter(engine: Any, prompt_ids: tuple[int, ...], embedding: Any,
                          tenant: str | None) -> str | None:
    """Name the adapter a new request (submitted without one) should run with, or None for
    the base model. Called at submit time on the caller's thread; ``embedding`` is None when
    the caller has none (the implementation computes what it needs); ``tenant`` is the request's
    ``GenerationParams.tenant`` (a learning plugin never gives one tenant another's adapter)."""


@hookspec
def ruvllm_engine_metrics(engine: Any) -> list[PluginMetric]:
    """This plugin's figures for ``engine`` (an empty list when it does nothing for it), read
    each time the engine's metrics are (``/metrics``, the benchmark, the Ray replicas' reports):
    on the reader's thread, so read counters, never wait for a lock the plugin's work holds.
    An exception is logged and leaves the engine's own metrics whole."""
