"""``GET /metrics``: the engine's MetricsSnapshot in Prometheus text exposition format 0.0.4.

Names follow vLLM's (``vllm:time_to_first_token_seconds`` -> ``ruvllm:time_to_first_token_seconds``)
with a ``model_name`` label, so dashboards built for vLLM need only the prefix changed.
"""

from __future__ import annotations

from ruvllm.serving import Histogram, MetricsSnapshot

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "ruvllm:"

_HISTOGRAMS = (
    ("time_to_first_token_seconds", "time_to_first_token", "Histogram of time to first token in seconds."),
    ("time_per_output_token_seconds", "time_per_output_token",
     "Histogram of mean time per output token (after the first) per request, in seconds."),
    ("inter_token_latency_seconds", "inter_token_latency", "Histogram of time between tokens in seconds."),
    ("e2e_request_latency_seconds", "e2e_latency", "Histogram of end to end request latency in seconds."),
    ("request_queue_time_seconds", "queue_time", "Histogram of time spent waiting in the queue in seconds."),
)


def _labels(labels: dict[str, str]) -> str:
    def esc(v: str) -> str:
        return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    inner = ",".join(f'{k}="{esc(v)}"' for k, v in labels.items())
    return "{" + inner + "}" if inner else ""


def _num(v: float) -> str:
    if v == float("inf"):
        return "+Inf"
    return repr(float(v)) if isinstance(v, float) else str(v)


class _Writer:
    def __init__(self, labels: dict[str, str]):
        self.lines: list[str] = []
        self.labels = labels

    def metric(self, name: str, kind: str, help_: str, value: float,
               extra: dict[str, str] | None = None) -> None:
        full = PREFIX + name
        self.lines += [f"# HELP {full} {help_}", f"# TYPE {full} {kind}"]
        self.sample(full, value, extra)

    def sample(self, full: str, value: float, extra: dict[str, str] | None = None) -> None:
        self.lines.append(f"{full}{_labels({**self.labels, **(extra or {})})} {_num(value)}")

    def histogram(self, name: str, help_: str, h: Histogram) -> None:
        full = PREFIX + name
        self.lines += [f"# HELP {full} {help_}", f"# TYPE {full} histogram"]
        for bound, count in zip(h.buckets, h.counts, strict=True):
            if bound != float("inf"):
                self.sample(full + "_bucket", count, {"le": _num(float(bound))})
        self.sample(full + "_bucket", h.count, {"le": "+Inf"})
        self.sample(full + "_sum", float(h.sum))
        self.sample(full + "_count", h.count)


def render_metrics(snap: MetricsSnapshot, *, model_name: str, backend: str) -> str:
    w = _Writer({"model_name": model_name, "backend": backend})
    w.metric("num_requests_running", "gauge", "Number of requests in model execution batches.",
             snap.running)
    w.metric("num_requests_waiting", "gauge", "Number of requests waiting to be processed.", snap.waiting)
    w.metric("kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.",
             float(snap.kv_usage))
    w.metric("prefix_cache_queries_total", "counter",
             "Prefix cache queries, in terms of number of queried tokens.", snap.prefix_cache_queries)
    w.metric("prefix_cache_hits_total", "counter",
             "Prefix cache hits, in terms of number of cached tokens.", snap.prefix_cache_hits)
    w.metric("prefix_cache_hit_rate", "gauge", "Fraction of queried prefix tokens found in the cache.",
             float(snap.prefix_cache_hit_rate))
    w.metric("num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.",
             snap.preemptions)
    w.metric("prompt_tokens_total", "counter", "Number of prefill tokens processed.", snap.prompt_tokens)
    w.metric("generation_tokens_total", "counter", "Number of generation tokens processed.",
             snap.generation_tokens)
    full = PREFIX + "request_success_total"
    w.lines += [f"# HELP {full} Count of finished requests by finish reason.", f"# TYPE {full} counter"]
    for reason in sorted({"stop", "length", "cancelled", "error", *snap.requests_finished}):
        w.sample(full, snap.requests_finished.get(reason, 0), {"finished_reason": reason})
    for name, attr, help_ in _HISTOGRAMS:
        w.histogram(name, help_, getattr(snap, attr))
    return "\n".join(w.lines) + "\n"
