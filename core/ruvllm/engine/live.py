"""A request in flight on the model thread: its output builder, sampler, sink and clock marks.

Both paths (executor and request level) end every request through :meth:`LiveRequest.end`, so
results, metrics and the caller's handle are completed in exactly one place, whatever ended
the request: a stop condition, cancellation, a timeout or an error.
"""

from __future__ import annotations

import time

import attrs

from ruvllm.engine.handles import Sink
from ruvllm.engine.metrics import EngineMetrics
from ruvllm.engine.prompt_logprobs import PromptLogprobsCollector
from ruvllm.engine.request import SchedRequest
from ruvllm.errors import RequestTimedOut
from ruvllm.generation import RequestOutputBuilder
from ruvllm.sampling import Sampler
from ruvllm.types import FinishReason, GenerationParams, SampledToken, Timings, TokenOutput


class LiveRequest:
    def __init__(self, sched: SchedRequest, params: GenerationParams, builder: RequestOutputBuilder,
                 sampler: Sampler | None, sink: Sink, *, arrival: float, timeout: float | None):
        self.sched = sched
        self.params = params
        self.builder = builder
        self.sampler = sampler
        self.sink = sink
        self.arrival = arrival
        self.timeout = timeout
        self.deadline = None if timeout is None else arrival + timeout
        self.started: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.ended = False
        #: Speculative decoding: tokens drafted for this request, and accepted.
        self.draft_tokens = 0
        self.accepted_draft_tokens = 0
        self._pending: list[TokenOutput] = []
        #: Set by the engine when the request asks for prompt logprobs.
        self.prompt_logprobs: PromptLogprobsCollector | None = None

    @property
    def request_id(self) -> str:
        return self.sched.request_id

    def mark_started(self, now: float, metrics: EngineMetrics) -> None:
        if self.started is None:
            self.started = now
            left = getattr(self.sink, "left_queue", None)
            if left is not None:  # the engine's bounded-queue counter
                left()
            metrics.observe_queue(now - self.arrival)

    def add_token(self, token: SampledToken, now: float, metrics: EngineMetrics) -> None:
        """Record one sampled token (outputs are sent by :meth:`flush`, once per step)."""
        first = self.first_token is None
        metrics.observe_token(
            first=first, since_arrival=now - self.arrival,
            since_previous=None if self.last_token is None else now - self.last_token,
        )
        if first:
            self.first_token = now
        self.last_token = now
        self._pending.append(self.builder.add(token))

    def record_drafts(self, drafted: int, accepted: int) -> None:
        self.draft_tokens += drafted
        self.accepted_draft_tokens += accepted

    def flush(self) -> None:
        if self._pending and not self.ended:
            self.sink.push(self._pending)
        self._pending = []

    def end(self, reason: FinishReason, metrics: EngineMetrics, *, error: BaseException | None = None,
            now: float | None = None) -> None:
        """Finish the request (idempotent) and complete its handle."""
        if self.ended:
            return
        now = time.perf_counter() if now is None else now
        b = self.builder
        if not b.finished:
            tail = b.finish(reason)
            if tail:
                self._pending.append(TokenOutput(index=len(b.token_ids), token_id=None, text=tail))
        result = b.result(self._timings(now))
        if self.prompt_logprobs is not None:
            result = attrs.evolve(result, prompt_logprobs=self.prompt_logprobs.result())
        if self.draft_tokens:
            result = attrs.evolve(result, usage=attrs.evolve(result.usage, draft_tokens=self.draft_tokens,
                                                             accepted_draft_tokens=self.accepted_draft_tokens))
        cached = min(self.sched.num_cached_tokens, result.usage.prompt_tokens)
        if cached:
            result = attrs.evolve(result, usage=attrs.evolve(result.usage, cached_prompt_tokens=cached))
        if isinstance(error, RequestTimedOut):
            error.partial = result
        metrics.observe_finish(
            reason="timeout" if isinstance(error, RequestTimedOut) else result.finish_reason.value,
            prompt_tokens=result.usage.prompt_tokens, output_tokens=result.usage.completion_tokens,
            e2e=now - self.arrival,
            ttft=None if self.first_token is None else self.first_token - self.arrival,
        )
        outputs, self._pending = self._pending, []
        self.ended = True
        self.sink.push(outputs, None if error is not None else result, error)

    def _timings(self, now: float) -> Timings:
        started = self.started if self.started is not None else now
        first = self.first_token if self.first_token is not None else now
        return Timings(
            queue=started - self.arrival,
            prefill=max(first - started, 0.0),
            decode=max(now - first, 0.0),
            time_to_first_token=first - self.arrival if self.first_token is not None else 0.0,
        )
