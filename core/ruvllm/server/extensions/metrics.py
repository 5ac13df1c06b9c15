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

The histograms are not prometheus_client ``Histogram`` objects: those only ``observe`` one value
at a time, while the engine keeps bucket counts, so carrying counts into them meant writing their
private per-bucket values. :class:`EngineHistograms`, a custom collector, keeps the per-bucket
totals and yields them as ``HistogramMetricFamily`` at each scrape, with the same names, labels and
``_created`` series a ``Histogram`` has.

Multiprocess mode: when ``PROMETHEUS_MULTIPROC_DIR`` is set (before the server starts, as
prometheus_client requires), the metric objects live in that directory's per-process files
and ``/metrics`` answers from a registry holding a ``MultiProcessCollector``, so whichever worker
is scraped reports every worker's engine: counters and histograms summed, running and waiting
requests summed over live processes, the KV-cache usage and prefix hit rate (fractions, which do
not add up) once per live process with a ``pid`` label. prometheus_client does not aggregate
custom collectors across processes, so each worker also writes its histogram totals to
``ruvllm_histograms_<pid>.json`` in that directory and :class:`EngineHistograms` sums every
worker's file (dead workers' too, as prometheus_client keeps their histograms). Each worker
refreshes its files every :data:`MULTIPROCESS_REFRESH` seconds, so a worker that is not scraped is
never staler than that. The deployment calls ``prometheus_client.multiprocess.mark_process_dead(pid)``
when a worker exits (gunicorn's ``child_exit``), as prometheus_client documents.

Plugins' figures (``MetricsSnapshot.plugins``, hook ``ruvllm_engine_metrics``) become metric
objects the first time a name is seen, counters and gauges as the engine's own are (a plugin
gauge is a count, summed over live processes); a name whose series would clash with the engine's
own or another plugin metric's is left out with a warning.
"""

from __future__ import annotations

import asyncio
import glob
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    generate_latest,
)
from prometheus_client.metrics_core import HistogramMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from ruvllm.serving import Histogram as SnapshotHistogram
from ruvllm.serving import MetricsSnapshot, PluginMetric

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
    ("kv_cache_capacity_tokens", "kv_capacity_tokens",
     "Tokens the engine's KV pool holds (shared by every request).", "livesum"),
    ("kv_cache_used_tokens", "kv_used_tokens", "Tokens of the KV pool held by running requests.", "livesum"),
    ("prefix_cache_prompts", "prefix_cache_prompts",
     "Finished requests' prompts kept for prefix-cache hits (per-sequence executors).", "livesum"),
    ("prefix_cache_host_bytes", "prefix_cache_host_bytes",
     "Host memory of kept prompts outside the KV pool (llama.cpp's parked prefixes).", "livesum"),
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
    ("spec_decode_num_drafts_total", "spec_decode_drafts",
     "Number of spec decoding drafts (a request verifying drafted tokens in a step)."),
    ("spec_decode_num_draft_tokens_total", "spec_decode_draft_tokens", "Number of draft tokens."),
    ("spec_decode_num_accepted_tokens_total", "spec_decode_accepted_tokens", "Number of accepted tokens."),
)
_HISTOGRAMS = (
    ("time_to_first_token_seconds", "time_to_first_token", "Histogram of time to first token in seconds."),
    ("time_per_output_token_seconds", "time_per_output_token",
     "Histogram of mean time per output token (after the first) per request, in seconds."),
    ("inter_token_latency_seconds", "inter_token_latency", "Histogram of time between tokens in seconds."),
    ("e2e_request_latency_seconds", "e2e_latency", "Histogram of end to end request latency in seconds."),
    ("request_queue_time_seconds", "queue_time", "Histogram of time spent waiting in the queue in seconds."),
)


def _series_names(name: str, kind: str) -> set[str]:
    """The names (without the prefix) a metric's series take: prometheus_client's counter
    ``x_total`` also exposes ``x`` and ``x_created``."""
    if kind == "gauge":
        return {name}
    base = name.removesuffix("_total")
    return {base, name, base + "_created"}


#: Names the engine's own series take (a plugin may not report under them).
_CORE_NAMES = frozenset(
    {name for name, *_ in _GAUGES}
    | {series for counter, *_ in (*_COUNTERS, ("request_success_total",))
       for series in _series_names(counter, "counter")}
    | {name + suffix for name, *_ in _HISTOGRAMS for suffix in ("", "_bucket", "_sum", "_count", "_created")})


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
        #: The snapshot attributes carried into :class:`EngineHistograms` (none when this model's
        #: buckets differ from the first model's).
        self.histograms: list[str] = []
        #: Plugin gauges this model has set (dropped to 0 when it unloads).
        self.plugin_gauges: set[str] = set()
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
        self._histograms = EngineHistograms(multiprocess_dir())
        self.registry.register(self._histograms)
        #: Plugin metric objects by name, created when a plugin first reports the name.
        self._plugin_families: dict[str, Gauge | Counter] = {}
        #: The series names those objects expose, and the names already refused (warned once).
        self._plugin_series: set[str] = set()
        self._refused: set[str] = set()
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
            series.gauges = [(attr, g.labels(**labels)) for attr, g in self._gauge_families]
            series.counters = [(attr, c.labels(**labels)) for attr, c in self._counter_families]
            for reason in FINISH_REASONS:
                self._finished.labels(**labels, finished_reason=reason)
            if self._histograms.accepts(first):
                series.histograms = [attr for _, attr, _ in _HISTOGRAMS]
                self._histograms.start(tuple(labels[k] for k in LABELS))
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
            for name in series.plugin_gauges:
                self._plugin_families[name].labels(**series.labels).set(0.0)
            del self._series[model_name]
        self._histograms.save()

    def refresh(self) -> None:
        """Carry every attached engine's current snapshot into the metric objects."""
        for series in list(self._series.values()):
            self._refresh(series)
        self._histograms.save()

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
            reported: set[str] = set()
            for metric in snap.plugins:
                if metric.name in reported:  # two plugins, one name: the first (hook order) counts
                    self._refuse(metric, "another plugin reported it first")
                    continue
                reported.add(metric.name)
                family = self._plugin_family(metric)
                if family is None:
                    continue
                child = family.labels(**series.labels)
                if metric.kind == "gauge":
                    child.set(metric.value)
                    series.plugin_gauges.add(metric.name)
                else:
                    child.inc(series.advance(("plugin", metric.name), metric.value))
            for name in series.plugin_gauges - reported:  # no longer reported (the plugin detached)
                self._plugin_families[name].labels(**series.labels).set(0.0)
            key = tuple(series.labels[k] for k in LABELS)
            for attr in series.histograms:
                h: SnapshotHistogram = getattr(snap, attr)
                grown = [series.advance((attr, i), n) for i, n in enumerate(_per_bucket(h))]
                self._histograms.add(key, attr, grown, series.advance((attr, "sum"), h.sum))

    def _plugin_family(self, metric: PluginMetric) -> Gauge | Counter | None:
        """The metric object for a plugin's figure (created on first sight; under the lock), or
        None when it cannot be exposed."""
        family = self._plugin_families.get(metric.name)
        if family is None and metric.name not in self._refused:
            series = _series_names(metric.name, metric.kind)
            if series & _CORE_NAMES:
                return self._refuse(metric, "it is one of the engine's own metrics")
            if series & self._plugin_series:
                return self._refuse(metric, "its series clash with another plugin metric's")
            self._plugin_series |= series
            if metric.kind == "gauge":
                family = Gauge(PREFIX + metric.name, metric.help, LABELS, registry=self._own,
                               multiprocess_mode="livesum")
            else:
                family = Counter(PREFIX + metric.name, metric.help, LABELS, registry=self._own)
            self._plugin_families[metric.name] = family
        return family

    def _refuse(self, metric: PluginMetric, why: str) -> None:
        if metric.name not in self._refused:
            self._refused.add(metric.name)
            log.warning("plugin metric %r (%s) is left out of /metrics: %s", metric.name, metric.kind, why)

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


class EngineHistograms(Collector):
    """The engines' histograms (:data:`_HISTOGRAMS`) per label set, as a custom collector.

    Holds, per ``(model_name, model, backend)``, each histogram's observations per bucket and its
    sum, advanced by :class:`ServerMetrics` with what the engine counted since the last refresh,
    and yields them cumulatively (``le`` formatted as prometheus_client formats it) at each scrape.
    With ``directory`` (multiprocess mode) :meth:`save` writes this process's totals there and
    :meth:`collect` sums every process's file, since prometheus_client's ``MultiProcessCollector``
    reads only its own files."""

    FILE_PREFIX = "ruvllm_histograms_"

    def __init__(self, directory: str | None = None):
        self.directory = directory
        #: Finite bucket bounds per snapshot attribute, from the first engine attached (every
        #: ServingEngine has the same).
        self.bounds: dict[str, list[float]] = {}
        #: label values -> attribute -> [observations per bucket (the last is +Inf's)..., sum]
        self._totals: dict[tuple[str, ...], dict[str, list[float]]] = {}
        self._created: dict[tuple[str, ...], float] = {}
        self._lock = threading.Lock()

    def accepts(self, snapshot: MetricsSnapshot) -> bool:
        """Whether ``snapshot``'s histograms have this collector's bounds (the first one's set
        them)."""
        bounds = {attr: _bounds(getattr(snapshot, attr)) for _, attr, _ in _HISTOGRAMS}
        with self._lock:
            if not self.bounds:
                self.bounds = bounds
            return bounds == self.bounds

    def start(self, key: tuple[str, ...]) -> None:
        """Show ``key``'s histograms (at 0 until it counts anything); a label set seen before
        keeps its totals."""
        with self._lock:
            if key not in self._totals:
                self._totals[key] = {attr: [0.0] * (len(self.bounds[attr]) + 2) for attr in self.bounds}
                self._created[key] = time.time()

    def add(self, key: tuple[str, ...], attr: str, per_bucket: list[float], total: float) -> None:
        """Add ``per_bucket[i]`` observations to bucket ``i`` of ``key``'s ``attr`` and ``total`` to
        its sum."""
        with self._lock:
            values = self._totals[key][attr]
            for i, grown in enumerate(per_bucket):
                values[i] += grown
            values[-1] += total

    def _path(self, pid: int) -> str:
        assert self.directory is not None
        return os.path.join(self.directory, f"{self.FILE_PREFIX}{pid}.json")

    def save(self) -> None:
        """Multiprocess mode: replace this process's file with its totals (atomically, so a
        scrape in another worker never reads half a file)."""
        if self.directory is None:
            return
        with self._lock:
            data = {"bounds": self.bounds, "totals": [[list(k), v] for k, v in self._totals.items()]}
        path = self._path(os.getpid())
        with open(path + ".tmp", "w") as fh:
            json.dump(data, fh)
        os.replace(path + ".tmp", path)

    def _gathered(self) -> tuple[dict[str, list[float]], dict[tuple[str, ...], dict[str, list[float]]]]:
        """The bounds and the totals to expose: this process's, or every process's summed."""
        with self._lock:
            bounds = dict(self.bounds)
            if self.directory is None:
                return bounds, {k: {a: list(v) for a, v in t.items()} for k, t in self._totals.items()}
        summed: dict[tuple[str, ...], dict[str, list[float]]] = {}
        for path in sorted(glob.glob(os.path.join(self.directory, self.FILE_PREFIX + "*.json"))):
            try:
                with open(path) as fh:
                    data = json.load(fh)
            except (OSError, ValueError):  # removed meanwhile, or not ours
                log.warning("skipping unreadable metrics file %s", path)
                continue
            bounds = bounds or data["bounds"]
            if data["bounds"] != bounds:
                log.warning("%s has other histogram buckets than this process; left out", path)
                continue
            for key, per_attr in data["totals"]:
                into = summed.setdefault(tuple(key), {})
                for attr, values in per_attr.items():
                    acc = into.setdefault(attr, [0.0] * len(values))
                    into[attr] = [a + b for a, b in zip(acc, values, strict=True)]
        return bounds, summed

    def collect(self) -> Iterator[Metric]:
        bounds, totals = self._gathered()
        if not bounds:
            return
        for name, attr, help_ in _HISTOGRAMS:
            family = HistogramMetricFamily(PREFIX + name, help_, labels=LABELS)
            for key, per_attr in totals.items():
                values = per_attr.get(attr)
                if values is None:
                    continue
                cumulative, buckets = 0.0, []
                for bound, n in zip([*bounds[attr], INF], values[:-1], strict=True):
                    cumulative += n
                    buckets.append((floatToGoString(bound), cumulative))
                family.add_metric(list(key), buckets, values[-1])
                created = self._created.get(key) if self.directory is None else None
                if created is not None:  # what a prometheus_client Histogram shows per child
                    labels = dict(zip(LABELS, key, strict=True))
                    family.samples.append(Sample(PREFIX + name + "_created", labels, created))
            yield family
