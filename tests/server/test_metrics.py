"""/metrics through prometheus_client: the engine's snapshot reaches Prometheus' text format with
the same numbers (histogram buckets, sums, counters, gauges) and labels, scrape after scrape; each
app has its own registry; with PROMETHEUS_MULTIPROC_DIR, workers' metrics add up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import attrs
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families
from ruvllm.server.extensions.metrics import ServerMetrics
from ruvllm.serving import Histogram, MetricsSnapshot, PluginMetric

BUCKETS = (0.01, 0.1, 1.0)
LABELS = {"model_name": "served", "model": "SmolLM2", "backend": "fake"}


def hist(values: list[float]) -> Histogram:
    counts = tuple(sum(v <= b for v in values) for b in BUCKETS)
    return Histogram(buckets=BUCKETS, counts=counts, sum=float(sum(values)), count=len(values))


def snapshot(ttft: list[float], *, running: int = 0, tokens: int = 0, finished: dict | None = None,
             kv: float = 0.0) -> MetricsSnapshot:
    empty = hist([])
    return MetricsSnapshot(
        time_to_first_token=hist(ttft), time_per_output_token=empty, inter_token_latency=empty,
        e2e_latency=empty, queue_time=empty, running=running, waiting=1, kv_usage=kv,
        kv_capacity_tokens=11520, kv_used_tokens=int(kv * 11520), prefix_cache_prompts=3,
        prefix_cache_host_bytes=3 * 737280,
        prefix_cache_queries=10, prefix_cache_hits=4, preemptions=0, prompt_tokens=2 * tokens,
        generation_tokens=tokens, requests_finished=finished or {})


def scrape(text: str) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            assert {k: s.labels[k] for k in LABELS if k in s.labels} == LABELS or "pid" in s.labels, s
            rest = tuple(sorted((k, v) for k, v in s.labels.items() if k not in LABELS))
            out[(s.name, rest)] = s.value
    return out


def test_snapshot_numbers_and_labels_survive_every_scrape():
    current = [snapshot([0.005, 0.05, 0.5, 5.0], running=2, tokens=7, finished={"stop": 1, "length": 2},
                        kv=0.25)]
    metrics = ServerMetrics(lambda: current[0], **LABELS)
    for _ in range(2):  # a scrape with nothing new changes nothing
        m = scrape(metrics.render().decode())
        assert m[("ruvllm:time_to_first_token_seconds_bucket", (("le", "0.01"),))] == 1
        assert m[("ruvllm:time_to_first_token_seconds_bucket", (("le", "1.0"),))] == 3
        assert m[("ruvllm:time_to_first_token_seconds_bucket", (("le", "+Inf"),))] == 4
        assert m[("ruvllm:time_to_first_token_seconds_count", ())] == 4
        assert m[("ruvllm:time_to_first_token_seconds_sum", ())] == pytest.approx(5.555)
        assert m[("ruvllm:generation_tokens_total", ())] == 7
        assert m[("ruvllm:prompt_tokens_total", ())] == 14
        assert m[("ruvllm:num_requests_running", ())] == 2
        assert m[("ruvllm:kv_cache_usage_perc", ())] == 0.25
        assert m[("ruvllm:kv_cache_capacity_tokens", ())] == 11520
        assert m[("ruvllm:kv_cache_used_tokens", ())] == 2880
        assert m[("ruvllm:prefix_cache_hit_rate", ())] == 0.4
        assert m[("ruvllm:prefix_cache_prompts", ())] == 3
        assert m[("ruvllm:prefix_cache_host_bytes", ())] == 3 * 737280
        assert m[("ruvllm:request_success_total", (("finished_reason", "length"),))] == 2
        assert m[("ruvllm:request_success_total", (("finished_reason", "cancelled"),))] == 0
    current[0] = snapshot([0.005, 0.05, 0.5, 5.0, 0.05, 0.2], running=0, tokens=9,
                          finished={"stop": 1, "length": 2, "timeout": 1})
    m = scrape(metrics.render().decode())
    assert m[("ruvllm:time_to_first_token_seconds_bucket", (("le", "0.1"),))] == 3
    assert m[("ruvllm:time_to_first_token_seconds_count", ())] == 6
    assert m[("ruvllm:time_to_first_token_seconds_sum", ())] == pytest.approx(5.805)
    assert m[("ruvllm:generation_tokens_total", ())] == 9
    assert m[("ruvllm:num_requests_running", ())] == 0
    assert m[("ruvllm:request_success_total", (("finished_reason", "timeout"),))] == 1


def test_a_model_loaded_again_continues_its_histograms_and_other_buckets_are_left_out():
    metrics = ServerMetrics(lambda: snapshot([0.005, 0.5]), **LABELS)
    metrics.render()
    metrics.detach("served")
    metrics.attach(lambda: snapshot([0.05]), **LABELS)  # a fresh engine counts from 0 again
    m = scrape(metrics.render().decode())
    assert m[("ruvllm:time_to_first_token_seconds_count", ())] == 3
    assert m[("ruvllm:time_to_first_token_seconds_bucket", (("le", "0.1"),))] == 2
    assert m[("ruvllm:time_to_first_token_seconds_sum", ())] == pytest.approx(0.555)
    assert m[("ruvllm:num_requests_running", ())] == 0
    other = snapshot([0.5])
    odd = Histogram(buckets=(0.5, 2.0), counts=(1, 1), sum=0.5, count=1)
    other = attrs.evolve(other, time_to_first_token=odd)
    metrics.attach(lambda: other, model_name="odd", model="m", backend="b")
    names = {s.labels.get("model_name") for f in text_string_to_metric_families(metrics.render().decode())
             if f.type == "histogram" for s in f.samples}
    assert names == {"served"}


def _plugins(updates: float, waiting: float, *extra: PluginMetric) -> tuple[PluginMetric, ...]:
    return (PluginMetric(name="sona_updates_total", help="Updates run.", kind="counter", value=updates),
            PluginMetric(name="sona_scores_waiting", help="Scores waiting.", kind="gauge", value=waiting),
            *extra)


def test_plugin_figures_are_exposed_counters_advancing_and_gauges_set(caplog):
    clash = PluginMetric(name="num_requests_running", help="Mine.", kind="gauge", value=99)
    current = [attrs.evolve(snapshot([], running=2), plugins=_plugins(3, 5, clash))]
    metrics = ServerMetrics(lambda: current[0], **LABELS)
    m = scrape(metrics.render().decode())
    assert m[("ruvllm:sona_updates_total", ())] == 3 and m[("ruvllm:sona_scores_waiting", ())] == 5
    assert m[("ruvllm:num_requests_running", ())] == 2  # the engine's own, not the plugin's 99
    assert "'num_requests_running' (gauge) is left out of /metrics" in caplog.text
    # A new name joins; one whose series would clash with a plugin metric's (``x_total`` also
    # exposes ``x``), or that another plugin reported first, is left out; the rest go on.
    joins = PluginMetric(name="sona_consolidations_total", help="Deep loops.", kind="counter", value=1)
    clashes = PluginMetric(name="sona_scores_waiting_total", help="x", kind="counter", value=1)
    shadows = PluginMetric(name="sona_updates", help="x", kind="gauge", value=7)
    current[0] = attrs.evolve(current[0], plugins=(*_plugins(4, 8), joins, clashes, attrs.evolve(
        joins, name="sona_updates_total", value=100)))
    with caplog.at_level("WARNING"):
        m = scrape(metrics.render().decode())
    assert m[("ruvllm:sona_updates_total", ())] == 4 and m[("ruvllm:sona_scores_waiting", ())] == 8
    assert m[("ruvllm:sona_consolidations_total", ())] == 1 and "ruvllm:sona_scores_waiting_total" not in {
        name for name, _ in m}
    assert "'sona_scores_waiting_total' (counter) is left out of /metrics: its series clash" in caplog.text
    assert "'sona_updates_total' (counter) is left out of /metrics: another plugin reported it first" \
        in caplog.text
    current[0] = attrs.evolve(current[0], plugins=(shadows,))
    with caplog.at_level("WARNING"):
        m = scrape(metrics.render().decode())
    assert "'sona_updates' (gauge) is left out of /metrics: its series clash" in caplog.text
    # A counter no longer reported keeps its total; a gauge no longer reported reads 0.
    assert m[("ruvllm:sona_updates_total", ())] == 4 and m[("ruvllm:sona_scores_waiting", ())] == 0
    current[0] = attrs.evolve(current[0], plugins=_plugins(6, 2))
    metrics.detach("served")  # unloading: the counter keeps its total, the gauge drops to 0
    m = scrape(metrics.render().decode())
    assert m[("ruvllm:sona_updates_total", ())] == 6 and m[("ruvllm:sona_scores_waiting", ())] == 0


def test_each_app_has_its_own_registry():
    first = ServerMetrics(lambda: snapshot([0.5], tokens=3), **LABELS)
    second = ServerMetrics(lambda: snapshot([], tokens=5), **LABELS)  # same names: no clash
    assert scrape(first.render().decode())[("ruvllm:generation_tokens_total", ())] == 3
    assert scrape(second.render().decode())[("ruvllm:generation_tokens_total", ())] == 5
    default = prometheus_client.generate_latest(prometheus_client.REGISTRY).decode()
    assert "ruvllm:" not in default


WORKER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from test_metrics import LABELS, scrape, snapshot
    from prometheus_client import multiprocess
    from ruvllm.server.extensions.metrics import ServerMetrics

    ttft, running, tokens, dead = json.loads(sys.argv[1])
    for pid in dead:
        multiprocess.mark_process_dead(pid)
    metrics = ServerMetrics(lambda: snapshot(ttft, running=running, tokens=tokens), **LABELS)
    assert metrics.multiprocess
    found = scrape(metrics.render().decode())
    rows = [[name, labels, value] for (name, labels), value in found.items()]
    print(json.dumps({{"pid": __import__("os").getpid(), "metrics": rows}}))
""")


def _worker(tmp_path, *args) -> tuple[int, dict]:
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    script = WORKER.format(tests=os.path.dirname(__file__))
    out = subprocess.run([sys.executable, "-c", script, json.dumps(args)], env=env, check=True,
                         capture_output=True, text=True, timeout=120).stdout
    reply = json.loads(out)
    return reply["pid"], {(n, tuple(tuple(p) for p in labels)): v for n, labels, v in reply["metrics"]}


def test_multiprocess_mode_adds_up_every_worker(tmp_path):
    first, _ = _worker(tmp_path, [0.005, 0.5], 2, 4, [])
    _, m = _worker(tmp_path, [0.05], 3, 6, [])  # the first worker's files are still there
    assert m[("ruvllm:generation_tokens_total", ())] == 10
    assert m[("ruvllm:time_to_first_token_seconds_count", ())] == 3
    assert m[("ruvllm:time_to_first_token_seconds_bucket", (("le", "0.1"),))] == 2
    assert m[("ruvllm:time_to_first_token_seconds_sum", ())] == pytest.approx(0.555)
    assert m[("ruvllm:num_requests_running", ())] == 5  # live processes' gauges are summed
    _, m = _worker(tmp_path, [], 1, 0, [first])
    assert m[("ruvllm:num_requests_running", ())] == 3 + 1  # the dead first worker's gauge is gone
    assert m[("ruvllm:generation_tokens_total", ())] == 10  # its counts stay
