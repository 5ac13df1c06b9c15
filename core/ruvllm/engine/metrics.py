"""Latency histograms and counters, recorded by the model thread and read as a snapshot.

Definitions (all wall-clock seconds, measured from the moment ``submit`` accepted the request):

- queue time: until the request was first scheduled into a step;
- time to first token (TTFT): until its first token was sampled;
- inter-token latency (ITL): between consecutive tokens of one request (one observation each);
- time per output token (TPOT): per request, ``(e2e - TTFT) / (tokens - 1)``, for requests with
  at least two tokens;
- end-to-end latency: until the request finished (any reason).
"""

from __future__ import annotations

import bisect
import threading
from collections import Counter

from ruvllm.serving import Histogram, MetricsSnapshot, PluginMetric

#: Bucket bounds in seconds, Prometheus style (vLLM uses similar ones).
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4,
                   0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0)


class _Hist:
    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS):
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.counts):
            self.counts[i] += 1
        self.sum += value
        self.count += 1

    def freeze(self) -> Histogram:
        cumulative, total = [], 0
        for c in self.counts:
            total += c
            cumulative.append(total)
        return Histogram(buckets=self.buckets, counts=tuple(cumulative), sum=self.sum, count=self.count)


class EngineMetrics:
    """Thread-safe: the model thread writes, any thread reads a consistent snapshot."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ttft = _Hist()
        self.tpot = _Hist()
        self.itl = _Hist()
        self.e2e = _Hist()
        self.queue = _Hist()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: Counter[str] = Counter()
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted_tokens = 0

    def observe_queue(self, seconds: float) -> None:
        with self._lock:
            self.queue.observe(seconds)

    def observe_token(self, *, first: bool, since_arrival: float, since_previous: float | None) -> None:
        with self._lock:
            self.generation_tokens += 1
            if first:
                self.ttft.observe(since_arrival)
            elif since_previous is not None:
                self.itl.observe(since_previous)

    def observe_drafts(self, drafted: int, accepted: int) -> None:
        """One request verified ``drafted`` tokens in a step and kept ``accepted``."""
        with self._lock:
            self.spec_drafts += 1
            self.spec_draft_tokens += drafted
            self.spec_accepted_tokens += accepted

    def observe_finish(self, *, reason: str, prompt_tokens: int, output_tokens: int, e2e: float,
                       ttft: float | None) -> None:
        with self._lock:
            self.finished[reason] += 1
            self.prompt_tokens += prompt_tokens
            self.e2e.observe(e2e)
            if ttft is not None and output_tokens > 1:
                self.tpot.observe((e2e - ttft) / (output_tokens - 1))

    def snapshot(self, *, running: int, waiting: int, kv_usage: float, prefix_queries: int,
                 prefix_hits: int, preemptions: int, kv_capacity_tokens: int = 0,
                 kv_used_tokens: int = 0, prefix_cache_prompts: int = 0, prefix_cache_host_bytes: int = 0,
                 plugins: tuple[PluginMetric, ...] = ()) -> MetricsSnapshot:
        with self._lock:
            return MetricsSnapshot(
                time_to_first_token=self.ttft.freeze(),
                time_per_output_token=self.tpot.freeze(),
                inter_token_latency=self.itl.freeze(),
                e2e_latency=self.e2e.freeze(),
                queue_time=self.queue.freeze(),
                running=running,
                waiting=waiting,
                kv_usage=kv_usage,
                kv_capacity_tokens=kv_capacity_tokens,
                kv_used_tokens=kv_used_tokens,
                prefix_cache_prompts=prefix_cache_prompts,
                prefix_cache_host_bytes=prefix_cache_host_bytes,
                prefix_cache_queries=prefix_queries,
                prefix_cache_hits=prefix_hits,
                preemptions=preemptions,
                prompt_tokens=self.prompt_tokens,
                generation_tokens=self.generation_tokens,
                requests_finished=dict(self.finished),
                spec_decode_drafts=self.spec_drafts,
                spec_decode_draft_tokens=self.spec_draft_tokens,
                spec_decode_accepted_tokens=self.spec_accepted_tokens,
                plugins=plugins,
            )
