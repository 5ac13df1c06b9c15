"""``GET /metrics``: the engine's metrics in Prometheus' text format, through ``prometheus_client``.

Names follow vLLM's (``vllm:time_to_first_token_seconds`` -> ``ruvllm:time_to_first_token_seconds``)
so dashboards built for vLLM need only the prefix changed. Every series carries ``model_name``
(the name clients send), ``model`` (the loaded model's own name) and ``backend``; a server of
several models reports each under its own ``model_name``.

The engine keeps its own counters and histograms (``engine.metrics()``, a MetricsSnapshot, which
the benchmark reads too). :class:`ServerMetrics` carries them into prometheus_client metric
objects when it is refreshed (at each scrape): gauges are set, counters and histograms advance by
what changed since the previous refresh. Each app has its own ``CollectorRegistry``: two apps in
one process (tests, several engines) neither share nor clash, and nothing lands in
prometheus_client's global registry.

Multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set (before the server starts, as
prometheus_client requires), the metric objects live in that directory's per-process files
and ``/metrics`` answers from a registry holding a ``MultiProcessCollector``, so whichever worker
is scraped reports every worker's engine: counters and histograms summed, running and waiting
requests summed over live processes, the KV-cache usage and prefix hit rate (fractions, which do
not add up) once per live process with a ``pid`` label. Each worker also refreshes its files every
:data:`MULTIPROCESS_REFRESH` seconds, so a worker that is not scraped is never staler than that.
The deployment calls ``prometheus_client.multiprocess.mark_process_dead(pid)`` when a worker exits
(gunicorn's ``child_exit``), as prometheus_client documents.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

from ruvllm.serving import Histogram as SnapshotHistogram
from ruvllm.serving import MetricsSnapshot

log = logging.getLogger(__name__)
CONTENT_TYPE = CONTENT_TYPE_LATEST
PREFIX = "ruvllm:"
LABELS = ("model_name", "model", "backend")
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
#: Seconds between a worker's refreshes of its files in multiprocess mode.
MULTIPROCESS_REFRESH = 5.0
#: Finish reasons always present (at 0 before the first such request).
FINISH_REASONS = ("stop", "length", "cancelled", "error")
INF = float("inf")

#: (name, MetricsSnapshot attribute, help, multiprocess mode)
_GAUGES = (
    ("num_requests_running", "running", "Number of requests in model execution batches.", "livesum"),
    ("num_requests_waiting", "waiting", "Number of requests waiting to be processed.", "livesum"),
    ("kv_cache_usage_perc", "kv_usage", "KV-cache usage. 1 means 100 percent usage.", "liveall"),
    ("prefix_cache_hit_rate", "prefix_cache_hit_rate",
     "Fraction of queried prefix tokens found in the cache.", "liveall"),
)
#: (name, MetricsSnapshot attribute, help)
_COUNTERS = (
    ("prefix_cache_queries_total", "prefix_cache_queries",
     "Prefix cache queries, in terms of number of queried tokens."),
    ("prefix_cache_hits_total", "prefix_cache_hits",
     "Prefix cache hits, in terms of number of cached tokens."),
    ("num_preemptions_total", "preemptions", "Cumulative number of preemptions from the engine."),
    ("prompt_tokens_total", "prompt_tokens", "Number of prefill tokens processed."),
    ("generation_tokens_total", "generation_tokens", "Number of generation tokens processed."),
)
_HISTOGRAMS = (
    ("time_to_first_token_seconds", "time_to_first_token", "Histogram of time to first token in seconds."),
    ("time_per_output_token_seconds", "time_per_output_token",
     "Histogram of mean time per output token (after the first) per request, in seconds."),
    ("inter_token_latency_seconds", "inter_token_latency", "Histogram of time between tokens in seconds."),
    ("e2e_request_latency_seconds", "e2e_latency", "Histogram of end to end request latency in seconds."),
    ("request_queue_time_seconds", "queue_time", "Histogram of time spent waiting in the queue in seconds."),
)


def multiprocess_dir() -> str | None:
    """The directory of prometheus_client's multiprocess mode, or None when it is off."""
    return os.environ.get(MULTIPROC_ENV) or None


def _bounds(h: SnapshotHistogram) -> list[float]:
    """The finite bucket bounds (prometheus_client adds +Inf itself)."""
    return [b for b in h.buckets if b != INF]


def _per_bucket(h: SnapshotHistogram) -> list[float]:
    """Observations per bucket (not cumulative), the last one being +Inf's."""
    out, below = [], 0
    for bound, cumulative in zip(h.buckets, h.counts, strict=True):
        if bound == INF:
            break
        out.append(cumulative - below)
        below = cumulative
    out.append(h.count - below)
    return out


class _Series:
    """One model's labelled children and what its engine last reported."""

    def __init__(self, snapshot: Callable[[], MetricsSnapshot], labels: dict[str, str]):
        self.snapshot = snapshot
        self.labels = labels
        self.gauges: list[tuple[str, Any]] = []
        self.counters: list[tuple[str, Any]] = []
        self.histograms: list[tuple[str, Any]] = []
        #: Totals already carried into the counters and histograms, by key.
        self.seen: dict[Any, Any] = {}

    def advance(self, key: Any, total: float) -> float:
        """How much ``total`` grew since the last refresh (never negative)."""
        grown = max(total - self.seen.get(key, 0), 0)
        self.seen[key] = max(total, self.seen.get(key, 0))
        return grown


class ServerMetrics:
    """The metrics of one app: its registry, its metric objects and, per served model, what its
    engine last reported. A server of several models :meth:`attach`-es each engine when it loads
    (its series carry the model's ``model_name``) and :meth:`detach`-es it when it unloads."""

    def __init__(self, snapshot: Callable[[], MetricsSnapshot] | None = None, *,
                 model_name: str | None = None, model: str | None = None, backend: str | None = None):
        self.multiprocess = multiprocess_dir() is not None
        #: What /metrics exposes.
        self.registry = CollectorRegistry()
        if self.multiprocess:
            # The metric objects write to this process's files; the collector reads every
            # process's. Registering the objects too would count this process twice.
            MultiProcessCollector(self.registry)
            self._own = None
        else:
            self._own = self.registry
        own = self._own
        self._gauge_families = [
            (attr, Gauge(PREFIX + name, help_, LABELS, registry=own, multiprocess_mode=mode))
            for name, attr, help_, mode in _GAUGES
        ]
        self._counter_families = [
            (attr, Counter(PREFIX + name, help_, LABELS, registry=own)) for name, attr, help_ in _COUNTERS
        ]
        self._finished = Counter(PREFIX + "request_success_total",
                                 "Count of finished requests by finish reason.",
                                 (*LABELS, "finished_reason"), registry=own)
        #: Created with the first engine's bucket bounds (every ServingEngine has the same).
        self._histogram_families: list[tuple[str, Any]] | None = None
        self._bounds: list[list[float]] = []
        self._series: dict[str, _Series] = {}
        self._lock = threading.Lock()
        if snapshot is not None:
            self.attach(snapshot, model_name=model_name or model or "", model=model or "",
                        backend=backend or "")

    def attach(self, snapshot: Callable[[], MetricsSnapshot], *, model_name: str, model: str,
               backend: str) -> None:
        """Report ``snapshot`` (an engine's ``metrics``) under ``model_name`` from now on. A model
        loaded again continues its counters: only what the new engine counts is added."""
        labels = {"model_name": model_name, "model": model, "backend": backend}
        series = _Series(snapshot, labels)
        first = snapshot()
        with self._lock:
            if self._histogram_families is None:
                self._histogram_families = [
                    (attr, Histogram(PREFIX + name, help_, LABELS, registry=self._own,
                                     buckets=_bounds(getattr(first, attr))))
                    for name, attr, help_ in _HISTOGRAMS
                ]
                self._bounds = [_bounds(getattr(first, attr)) for attr, _ in self._histogram_families]
            series.gauges = [(attr, g.labels(**labels)) for attr, g in self._gauge_families]
            series.counters = [(attr, c.labels(**labels)) for attr, c in self._counter_families]
            for reason in FINISH_REASONS:
                self._finished.labels(**labels, finished_reason=reason)
            families = zip(self._histogram_families, self._bounds, strict=True)
            same_buckets = all(_bounds(getattr(first, attr)) == bounds for (attr, _), bounds in families)
            if same_buckets:
                series.histograms = [(attr, h.labels(**labels)) for attr, h in self._histogram_families]
            else:
                log.warning("model %r reports histograms with other buckets than the first model; its "
                            "histograms are left out of /metrics", model_name)
            self._series[model_name] = series

    def detach(self, model_name: str) -> None:
        """Stop reading ``model_name``'s engine (it is unloading): its last counts are carried
        over and its gauges drop to 0."""
        series = self._series.get(model_name)
        if series is None:
            return
        try:
            self._refresh(series)
        except Exception:  # the engine may already be failing; the counters keep what they had
            log.exception("final metrics refresh of %r failed", model_name)
        with self._lock:
            for _, gauge in series.gauges:
                gauge.set(0.0)
            del self._series[model_name]

    def refresh(self) -> None:
        """Carry every attached engine's current snapshot into the metric objects."""
        for series in list(self._series.values()):
            self._refresh(series)

    def _refresh(self, series: _Series) -> None:
        snap = series.snapshot()
        with self._lock:
            for attr, gauge in series.gauges:
                gauge.set(float(getattr(snap, attr)))
            for attr, counter in series.counters:
                counter.inc(series.advance(attr, getattr(snap, attr)))
            for reason, total in snap.requests_finished.items():
                self._finished.labels(**series.labels, finished_reason=reason).inc(
                    series.advance(("finished", reason), total))
            for attr, hist in series.histograms:
                h: SnapshotHistogram = getattr(snap, attr)
                grown = [series.advance((attr, i), n) for i, n in enumerate(_per_bucket(h))]
                _add_observations(hist, grown, series.advance((attr, "sum"), h.sum))

    def render(self) -> bytes:
        """The text exposition, after a refresh."""
        self.refresh()
        return generate_latest(self.registry)

    async def refresh_periodically(self, interval: float = MULTIPROCESS_REFRESH) -> None:
        """Refresh every ``interval`` seconds until cancelled (multiprocess mode's app runs it)."""
        while True:
            await asyncio.sleep(interval)
            try:
                self.refresh()
            except Exception:  # a failed refresh must not end the next ones
                log.exception("refreshing the metrics failed")


def _add_observations(hist: Any, per_bucket: list[float], total: float) -> None:
    """Add ``per_bucket[i]`` observations to bucket ``i`` of a labelled Histogram and ``total`` to
    its sum. prometheus_client can only ``observe`` one value at a time and the engine keeps
    counts, not values; its per-bucket values (``_buckets``, ``_sum``: in memory, or this
    process's file in multiprocess mode) are what ``observe`` itself increments.
    tests/server/test_metrics.py checks the result against prometheus_client's own output."""
    for value, grown in zip(hist._buckets, per_bucket, strict=True):
        if grown:
            value.inc(grown)
    if total:
        hist._sum.inc(total)
