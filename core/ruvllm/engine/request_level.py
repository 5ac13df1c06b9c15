"""The request-level path, for backends without an iteration-level executor.

Each request runs through the backend's own ``generate`` iterator. Up to ``max_in_flight``
iterators are advanced round-robin, one token each per turn, all on the model thread: a backend
that batches internally (mistral.rs) sees several requests in flight and batches them itself;
a backend that cannot serve concurrent requests gets them one at a time. There is no KV
accounting here (the backend owns its memory), so KV usage and prefix-cache figures stay 0.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

from ruvllm.backend import LlmBackend
from ruvllm.engine.live import LiveRequest
from ruvllm.engine.metrics import EngineMetrics
from ruvllm.engine.options import EngineOptions
from ruvllm.engine.scheduler import Policy
from ruvllm.errors import BackendError, RequestTimedOut
from ruvllm.types import FinishReason, SampledToken

log = logging.getLogger(__name__)


class RequestLevelCore:
    path = "request"

    def __init__(self, backend: LlmBackend, options: EngineOptions, metrics: EngineMetrics):
        self.backend = backend
        self.metrics = metrics
        self.policy = options.policy
        self.aging = options.aging_interval
        caps = backend.capabilities()
        self.max_in_flight = options.max_in_flight if caps.concurrent_requests else 1
        self.waiting: list[LiveRequest] = []
        self.in_flight: dict[str, tuple[LiveRequest, Iterator[SampledToken]]] = {}
        self._seq = 0
        if options.speculative_method != "none":
            log.warning("speculative decoding is off: backend %r is served request by request (drafts "
                        "are verified in the executor path's steps)", backend.name)

    def max_request_tokens(self) -> int:
        return self.backend.info.context_length

    def add(self, live: LiveRequest) -> None:
        live.sched.seq_no = self._seq
        self._seq += 1
        self.waiting.append(live)

    def cancel(self, request_id: str) -> None:
        live = self._find(request_id)
        if live is not None:
            self._end(live, FinishReason.CANCELLED)

    def expire(self, now: float) -> None:
        everyone = self.waiting + [lv for lv, _ in self.in_flight.values()]
        for live in everyone:
            if live.deadline is not None and live.deadline <= now:
                self._end(live, FinishReason.CANCELLED, RequestTimedOut(live.request_id, live.timeout or 0.0))

    def shutdown(self) -> None:
        for live in self.waiting + [lv for lv, _ in self.in_flight.values()]:
            self._end(live, FinishReason.CANCELLED)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.in_flight)

    @property
    def num_running(self) -> int:
        return len(self.in_flight)

    @property
    def num_requeued(self) -> int:
        return 0

    def kv_usage(self) -> float:
        return 0.0

    def kv_capacity_tokens(self) -> int:
        return 0

    def kv_used_tokens(self) -> int:
        return 0

    def prefix_counters(self) -> tuple[int, int]:
        return 0, 0

    def prefix_cache_prompts(self) -> int:
        return 0

    def prefix_cache_host_bytes(self) -> int:
        return 0

    def preemptions(self) -> int:
        return 0

    # ----------------------------------------------------------------- the step

    def step(self) -> bool:
        self._admit()
        if not self.in_flight:
            return False
        for live, tokens in list(self.in_flight.values()):
            try:
                token = next(tokens, None)
            except Exception as exc:
                log.exception("backend generate failed")
                self._end(live, FinishReason.ERROR, BackendError(f"generation failed: {exc}"))
                continue
            now = time.perf_counter()
            if token is None:  # the backend stopped: its context window is full
                self._end(live, FinishReason.LENGTH, now=now)
                continue
            live.add_token(token, now, self.metrics)
            if live.builder.finished:
                self._end(live, live.builder.finish_reason, now=now)  # type: ignore[arg-type]
            else:
                live.flush()
        return True

    def _admit(self) -> None:
        now = time.monotonic()
        while self.waiting and len(self.in_flight) < self.max_in_flight:
            live = min(self.waiting, key=lambda lv: self._key(lv, now))
            self.waiting.remove(live)
            live.mark_started(time.perf_counter(), self.metrics)
            prompt = live.sched.token_ids[: live.sched.num_prompt]
            try:
                self.in_flight[live.request_id] = (live, iter(self.backend.generate(prompt, live.params)))
            except Exception as exc:
                self._end(live, FinishReason.ERROR, BackendError(f"generation failed to start: {exc}"))

    def _key(self, live: LiveRequest, now: float) -> tuple[float, int]:
        req = live.sched
        waited = max(now - req.arrival, 0.0) / self.aging
        if self.policy is Policy.PRIORITY:
            return (-(req.priority + waited), req.seq_no)
        if self.policy is Policy.SJF:
            return ((req.num_prompt + req.max_tokens) / 2.0 ** waited, req.seq_no)
        return (0.0, req.seq_no)

    def fail_all(self, error: BaseException) -> None:
        """End every request with ``error`` (an unexpected failure inside a step)."""
        for live in self.waiting + [lv for lv, _ in self.in_flight.values()]:
            self._end(live, FinishReason.ERROR, error)

    def _find(self, request_id: str) -> LiveRequest | None:
        if request_id in self.in_flight:
            return self.in_flight[request_id][0]
        return next((lv for lv in self.waiting if lv.request_id == request_id), None)

    def _end(self, live: LiveRequest, reason: FinishReason, error: BaseException | None = None,
             now: float | None = None) -> None:
        entry = self.in_flight.pop(live.request_id, None)
        if live in self.waiting:
            self.waiting.remove(live)
        if entry is not None:
            close = getattr(entry[1], "close", None)
            if close is not None:
                try:
                    close()  # the backend frees the request's state in its finally block
                except Exception:
                    log.exception("closing a backend stream failed")
        live.end(reason, self.metrics, error=error, now=now)
