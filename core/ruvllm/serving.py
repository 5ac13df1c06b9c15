"""What the server, the CLI and the benchmark need from an engine that serves many requests.

The ServingEngine (``ruvllm.engine``) implements this; the front-ends depend only on it, the
way vLLM's API server talks to its engine client.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Literal, Protocol

import attrs
import numpy as np

from ruvllm.sampling import LogitsProcessor
from ruvllm.tokenizer import Tokenizer
from ruvllm.types import Capabilities, GenerationParams, GenerationResult, ModelInfo, TokenOutput


@attrs.frozen(kw_only=True)
class Histogram:
    """Cumulative histogram in Prometheus form: ``counts[i]`` observations <= ``buckets[i]``."""

    buckets: tuple[float, ...]
    counts: tuple[int, ...]
    sum: float
    count: int

    def quantile(self, q: float) -> float:
        """Upper bound of the bucket holding quantile ``q`` (0 when empty)."""
        if self.count == 0:
            return 0.0
        target = q * self.count
        for bound, c in zip(self.buckets, self.counts, strict=True):
            if c >= target:
                return bound
        return float("inf")


_METRIC_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _metric_name(_: object, attribute: attrs.Attribute, value: str) -> None:
    if not _METRIC_NAME.fullmatch(value):
        raise ValueError(f"plugin metric name {value!r} is not a Prometheus name (letters, digits, '_')")


@attrs.frozen(kw_only=True)
class PluginMetric:
    """A figure a plugin reports beside the engine's own (hook ``ruvllm_engine_metrics``), so
    what a plugin does while serving (SONA's updates, say) is watched where the engine is:
    ``/metrics`` exposes it as ``ruvllm:<name>`` with the model's labels.

    Both kinds add up across replicas (Ray scale-out sums them): a counter is a total since the
    engine started (its name ends in ``_total``), a gauge a count of something now; never a
    ratio or a percentile, which a sum would make meaningless.
    """

    name: str = attrs.field(validator=_metric_name)
    help: str
    kind: Literal["counter", "gauge"] = attrs.field(validator=attrs.validators.in_(("counter", "gauge")))
    value: float

    def __attrs_post_init__(self) -> None:
        if (self.kind == "counter") != self.name.endswith("_total"):
            raise ValueError(f"plugin metric {self.name!r}: a counter's name ends in '_total', "
                             "a gauge's does not")


@attrs.frozen(kw_only=True)
class MetricsSnapshot:
    """A consistent view of the engine's counters at one moment."""

    time_to_first_token: Histogram
    time_per_output_token: Histogram
    inter_token_latency: Histogram
    e2e_latency: Histogram
    queue_time: Histogram
    running: int
    waiting: int
    kv_usage: float  # fraction of KV blocks in use, 0..1
    #: Tokens the engine's KV pool holds, and of those, held by running requests (0 on the
    #: request-level path, which keeps no KV of its own).
    kv_capacity_tokens: int = 0
    kv_used_tokens: int = 0
    #: Finished requests' prompts kept for prefix-cache hits (a per-sequence executor's donors),
    #: and the host memory those outside the KV pool take (llama.cpp's parked prefixes): what
    #: a server's resident memory grows by after traffic, up to the pool's size.
    prefix_cache_prompts: int = 0
    prefix_cache_host_bytes: int = 0
    prefix_cache_queries: int  # tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens found
    preemptions: int
    prompt_tokens: int
    generation_tokens: int
    requests_finished: dict[str, int]  # by finish reason
    #: Speculative decoding (vLLM's ``spec_decode`` counters): steps in which a request verified
    #: drafted tokens, the tokens drafted, and of those, accepted.
    spec_decode_drafts: int = 0
    spec_decode_draft_tokens: int = 0
    spec_decode_accepted_tokens: int = 0
    #: What plugins reported for this engine (:class:`PluginMetric`), in hook order.
    plugins: tuple[PluginMetric, ...] = ()

    @property
    def spec_decode_acceptance_rate(self) -> float:
        n = self.spec_decode_draft_tokens
        return self.spec_decode_accepted_tokens / n if n else 0.0

    @property
    def prefix_cache_hit_rate(self) -> float:
        q = self.prefix_cache_queries
        return self.prefix_cache_hits / q if q else 0.0


class RequestHandle(Protocol):
    """One submitted request: iterate for tokens, await :meth:`result` for the end."""

    request_id: str

    def __aiter__(self) -> AsyncIterator[TokenOutput]: ...

    async def result(self) -> GenerationResult: ...

    def cancel(self) -> None:
        """Stop the request and free its KV blocks; ``result()`` then says ``cancelled``."""
        ...


class AdapterTarget(Protocol):
    """Where runtime LoRA changes go: an engine's backend adapters, changed between two steps so
    no forward pass sees a half-loaded adapter (see ``AsyncEngine.adapters``)."""

    def adapter_names(self) -> tuple[str, ...]: ...

    async def load_adapter_async(self, name: str, path: str) -> None:
        """Load (or replace) adapter ``name`` from the PEFT directory ``path``; ``ModelError``
        for unreadable or incompatible files."""
        ...

    async def unload_adapter_async(self, name: str) -> None: ...


class AsyncEngine(Protocol):
    """Everything the server reads from an engine is named here, so another engine (``RemoteEngine``
    under ``--ray``, a third party's) knows what it must offer and the server never probes."""

    @property
    def tokenizer(self) -> Tokenizer: ...

    @property
    def info(self) -> ModelInfo: ...

    @property
    def capabilities(self) -> Capabilities: ...

    @property
    def backend_name(self) -> str: ...

    #: "executor" (iteration-level continuous batching) or "request" (request-level path).
    path: str
    #: How waiting requests are ordered ("fcfs", "priority"): ``priority`` requests are refused
    #: unless it is "priority".
    scheduling_policy: str
    #: The grammar engine that compiles this engine's constraints ("llguidance", "xgrammar").
    guided_decoding_backend: str
    #: Why ``info.context_length`` is below the model's own context ("" when it is not), for
    #: the 400 of a request that does not fit.
    context_limit_note: str
    #: Why ``backend = "auto"`` picked ``backend_name`` (None when it was named), for the
    #: start-up banner and ``/health``.
    backend_choice: str | None

    def memory_summary(self) -> str | None:
        """The memory the backend sized from a setting (its KV cache), for the start-up banner."""
        ...

    def adapters(self) -> AdapterTarget | None:
        """Runtime LoRA loading on this engine; None when its backend has no LoRA capability."""
        ...

    def feedback(self, request_id: str, score: float) -> Awaitable[None] | None:
        """A user's score in [-1, 1] for a finished request, for a learning plugin; raises
        ``FeedbackNotFound`` when none holds the request. An engine whose learning plugin lives
        in another process (``ruvllm serve --ray``: the replica that served the request) returns
        an awaitable that delivers it, which the caller awaits (and which raises the same way)."""
        ...

    async def encode_async(self, text: str, *, add_special: bool = True,
                           parse_special: bool = False) -> list[int]:
        """Token ids of the prompt ``text`` (not empty), tokenized off the caller's event loop."""
        ...

    async def embed_async(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """L2-normalised, mean-pooled embeddings of ``inputs`` (token-id lists), one row each,
        computed without holding up running requests for the whole of a large request (the
        ServingEngine embeds ``max_batch_tokens`` tokens at a time, a step between);
        ``InvalidRequest`` naming ``model`` when the backend cannot embed, ``input[i]`` for a bad
        input (empty, too long, out of the vocabulary)."""
        ...

    async def submit(
        self,
        prompt_ids: Sequence[int],
        params: GenerationParams,
        *,
        request_id: str | None = None,
        priority: int = 0,
        timeout: float | None = None,
        cache_salt: str | None = None,
        logits_processors: Sequence[LogitsProcessor] = (),
        prediction: Sequence[int] = (),
    ) -> RequestHandle:
        """Queue a request; raises ``InvalidRequest`` / ``ContextLengthExceeded`` at once for a
        bad one and ``Overloaded`` when the queue is full. ``logits_processors`` (a grammar's)
        rewrite its logits before each choice; ``RemoteEngine`` takes grammar processors only.
        ``prediction``: the answer the client expects (token ids), verified as drafts where the
        engine can (OpenAI's Predicted Outputs), a refusal naming it where it cannot."""
        ...

    def metrics(self) -> MetricsSnapshot: ...

    async def shutdown(self) -> None: ...


def contract_members() -> frozenset[str]:
    """The names :class:`AsyncEngine` requires, for checking that an engine offers all of them
    (``typing.runtime_checkable`` would check methods only by presence, and not data members)."""
    own = {n for n, v in vars(AsyncEngine).items()
           if not n.startswith("_") and (callable(v) or isinstance(v, property))}
    return frozenset(own | set(AsyncEngine.__annotations__))


def missing_members(engine: object) -> list[str]:
    """What ``engine`` lacks of the AsyncEngine contract (empty when it offers everything)."""
    return sorted(n for n in contract_members() if not hasattr(engine, n))
