"""Core's generic plugin hooks as the engine calls them, with a recording plugin on the fake
model: every finished request reaches ``ruvllm_request_finished`` on the model thread before its
caller sees the result, feedback reaches ``ruvllm_feedback``, ``ruvllm_select_adapter`` is
asked at submit time, ``ruvllm_engine_metrics`` adds to the engine's metrics, and a failing
plugin never breaks serving (nor the metrics). Core names no plugin."""

from __future__ import annotations

import threading

import pluggy
import pytest
from engine_fakes import FakeBackend, PagedFakeExecutor
from ruvllm import hookspecs
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import FeedbackNotFound, InvalidRequest
from ruvllm.serving import PluginMetric
from ruvllm.types import GenerationParams

GENERIC_HOOKS = {"ruvllm_register_backends", "ruvllm_register_commands", "ruvllm_engine_started",
                 "ruvllm_request_finished", "ruvllm_feedback", "ruvllm_step_idle", "ruvllm_select_adapter",
                 "ruvllm_engine_metrics"}


class Recorder:
    def __init__(self) -> None:
        self.finished: list = []
        self.threads: list[str] = []
        self.scores: dict[str, float] = {}
        self.asked: list[tuple[int, ...]] = []
        self.idle = 0

    @hookspecs.hookimpl
    def ruvllm_request_finished(self, engine, trajectory) -> None:
        self.finished.append(trajectory)
        self.threads.append(threading.current_thread().name)

    @hookspecs.hookimpl
    def ruvllm_feedback(self, request_id: str, score: float) -> bool | None:
        if any(t.request_id == request_id for t in self.finished):
            self.scores[request_id] = score
            return True
        return None

    @hookspecs.hookimpl
    def ruvllm_select_adapter(self, engine, prompt_ids, embedding) -> str | None:
        self.asked.append(prompt_ids)
        return None

    @hookspecs.hookimpl
    def ruvllm_step_idle(self, engine) -> None:
        self.idle += 1


def _hooks(*plugins: object):
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    for plugin in plugins:
        pm.register(plugin)
    return pm.hook


def _engine(hooks) -> ServingEngine:
    return ServingEngine(FakeBackend(PagedFakeExecutor(num_blocks=64, block_size=4)),
                         EngineOptions(block_size=4), hooks=hooks)


def test_core_hooks_are_generic():
    names = {n for n in dir(hookspecs) if n.startswith("ruvllm_")}
    assert names == GENERIC_HOOKS
    assert not [n for n in names if "sona" in n]


def test_finished_requests_reach_the_hook_on_the_model_thread_before_the_result():
    rec = Recorder()
    with _engine(_hooks(rec)) as eng:
        handle = eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=4, ignore_eos=True),
                                 request_id="r-1")
        result = handle.result(timeout=10)
        (traj,) = rec.finished  # recorded before result() returned
        assert (traj.request_id, traj.prompt_ids, traj.output_ids) == ("r-1", (1, 2, 3), result.token_ids)
        assert traj.feedback is None and traj.adapter is None
        assert rec.threads == ["ruvllm-model"]
        assert rec.asked == [(1, 2, 3)]  # the router was asked at submit time
        eng.feedback("r-1", 0.5)
        assert rec.scores == {"r-1": 0.5}
        with pytest.raises(FeedbackNotFound):
            eng.feedback("unknown", 1.0)
        with pytest.raises(InvalidRequest, match="score"):
            eng.feedback("r-1", 2.0)
        eng.hooks.ruvllm_step_idle(engine=eng)
        assert rec.idle == 1


def test_a_failing_plugin_does_not_break_serving():
    class Broken:
        @hookspecs.hookimpl
        def ruvllm_request_finished(self, engine, trajectory) -> None:
            raise RuntimeError("plugin bug")

    with _engine(_hooks(Broken())) as eng:
        result = eng.submit_sync([4, 5], GenerationParams(max_tokens=3, ignore_eos=True)).result(timeout=10)
        assert len(result.token_ids) == 3


def test_without_a_learning_plugin_feedback_is_not_found():
    with _engine(_hooks()) as eng:
        eng.submit_sync([4, 5], GenerationParams(max_tokens=2), request_id="r-2").result(timeout=10)
        with pytest.raises(FeedbackNotFound, match="r-2"):
            eng.feedback("r-2", 1.0)


class Counting:
    """Reports how many requests it saw finish, and for which engine it was asked."""

    def __init__(self) -> None:
        self.finished = 0
        self.engines: list = []

    @hookspecs.hookimpl
    def ruvllm_request_finished(self, engine, trajectory) -> None:
        self.finished += 1

    @hookspecs.hookimpl
    def ruvllm_engine_metrics(self, engine) -> list[PluginMetric]:
        self.engines.append(engine)
        return [PluginMetric(name="counted_total", help="Requests counted.", kind="counter",
                             value=self.finished),
                PluginMetric(name="counting", help="Whether counting.", kind="gauge", value=1)]


def test_plugin_metrics_join_the_engines_snapshot_and_a_failing_plugin_leaves_the_engines_own():
    class Broken:
        @hookspecs.hookimpl
        def ruvllm_engine_metrics(self, engine) -> list[PluginMetric]:
            raise RuntimeError("plugin bug")

    counting = Counting()
    with _engine(_hooks(counting)) as eng:
        eng.submit_sync([4, 5], GenerationParams(max_tokens=2)).result(timeout=10)
        snap = eng.metrics()
        assert {(m.name, m.value) for m in snap.plugins} == {("counted_total", 1), ("counting", 1)}
        assert counting.engines[-1] is eng
    with _engine(_hooks(Broken())) as eng:
        eng.submit_sync([4, 5], GenerationParams(max_tokens=2)).result(timeout=10)
        snap = eng.metrics()
        assert snap.plugins == () and sum(snap.requests_finished.values()) == 1


@pytest.mark.parametrize(("name", "kind", "error"), [
    ("updates", "counter", "ends in '_total'"), ("waiting_total", "gauge", "ends in '_total'"),
    ("sona:updates_total", "counter", "not a Prometheus name"), ("x_total", "histogram", "kind"),
])
def test_a_plugin_metric_is_named_as_prometheus_expects(name: str, kind: str, error: str):
    with pytest.raises(ValueError, match=error):
        PluginMetric(name=name, help="h", kind=kind, value=0)
