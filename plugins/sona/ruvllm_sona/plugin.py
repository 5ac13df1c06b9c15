"""Entry point of the ``ruvllm`` plugin group: SONA's hook implementations.

Core's hooks are generic; SONA's loops implement them: the instant loop is
``ruvllm_request_finished``, feedback is ``ruvllm_feedback``, an on-demand background step is
``ruvllm_step_idle`` (SONA's own thread runs the background and deep loops on its timer, see
:meth:`~ruvllm_sona.controller.Sona.start`), routing is ``ruvllm_select_adapter``, and what the
loops have done reaches ``/metrics`` through ``ruvllm_engine_metrics``.

Each engine has at most one :class:`~ruvllm_sona.controller.Sona`, attached explicitly
(:func:`attach`) or by ``ServingEngine.from_config`` when ``[sona] enabled = true``. The hooks
find it by engine; engines without one are left alone (a dictionary lookup on the serving path).

Plugin discovery imports this module in every ruvllm process, and SONA's options and controller
import torch (through candle_like's LoRA code): they are imported only where SONA is used, so
an engine without a ``[sona]`` table never loads torch for it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import ruvllm
from ruvllm.types import Trajectory

from ruvllm_sona.totals import SonaTotals

if TYPE_CHECKING:
    from ruvllm.serving import PluginMetric

    from ruvllm_sona.options import SonaOptions

_attached: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
#: Each engine's SONA counts, kept across bindings (the metrics' counters never go back).
_totals: weakref.WeakKeyDictionary[Any, SonaTotals] = weakref.WeakKeyDictionary()


def attach(engine: Any, options: SonaOptions | None = None, *, start: bool = True):
    """Bind SONA to ``engine`` (replacing an earlier binding) and start its background loop."""
    from ruvllm_sona.controller import Sona

    old = _attached.pop(engine, None)
    if old is not None:
        old.close()
    sona = Sona(engine, options, _totals.setdefault(engine, SonaTotals()))
    _attached[engine] = sona
    return sona.start() if start else sona


def detach(engine: Any) -> None:
    sona = _attached.pop(engine, None)
    if sona is not None:
        sona.close()


def sona_for(engine: Any):
    """The Sona bound to ``engine``, or None."""
    return _attached.get(engine)


@ruvllm.hookimpl
def ruvllm_engine_started(engine: Any, config: Any) -> None:
    table = getattr(config, "sona", None)
    if not table:  # no [sona] table: SONA stays off, and its torch-based options stay unimported
        return
    from ruvllm_sona.options import SonaOptions

    options = SonaOptions.from_mapping(table)
    if options.enabled:
        attach(engine, options)


@ruvllm.hookimpl
def ruvllm_request_finished(engine: Any, trajectory: Trajectory) -> None:
    sona = _attached.get(engine)
    if sona is not None:
        sona.on_finished(trajectory)


@ruvllm.hookimpl
def ruvllm_feedback(request_id: str, score: float) -> bool | None:
    for sona in list(_attached.values()):
        if request_id in sona.store:
            return sona.feedback(request_id, score)
    return None


@ruvllm.hookimpl
def ruvllm_step_idle(engine: Any) -> None:
    """One background-loop step now (training on buffered feedback, then publishing)."""
    if engine in _attached:
        _attached[engine].background_step()


@ruvllm.hookimpl
def ruvllm_select_adapter(engine: Any, prompt_ids: tuple[int, ...], embedding: Any,
                          tenant: str | None) -> str | None:
    sona = _attached.get(engine)
    return None if sona is None else sona.select_adapter(prompt_ids, tenant)


@ruvllm.hookimpl
def ruvllm_engine_metrics(engine: Any) -> list[PluginMetric]:
    sona = _attached.get(engine)
    return [] if sona is None else sona.metrics()
