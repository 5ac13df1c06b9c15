"""Serving benchmark: many concurrent streaming clients, the throughput a server delivers.

Two kinds of target are measured the same way, token arrival times taken on the client side:
the in-process :class:`ruvllm.serving.AsyncEngine`, or any OpenAI-compatible server by URL
(``ruvllm serve``, ``python -m llama_cpp.server``, vLLM...). Requests arrive as fast as the
concurrency allows, or as a Poisson process at ``request_rate`` requests/s (seeded, so two
targets see the same arrival pattern), never more than ``concurrency`` in flight.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

import attrs

from ruvllm.bench.stats import summary
from ruvllm.errors import InvalidRequest
from ruvllm.serving import AsyncEngine
from ruvllm.types import GenerationParams


@attrs.define
class RequestRecord:
    """What the client observed for one request."""

    start: float = 0.0
    #: Arrival time of each streamed piece of text (seconds since start of the benchmark).
    arrivals: list[float] = attrs.field(factory=list)
    output_tokens: int = 0
    finish_reason: str | None = None
    error: str | None = None
    end: float = 0.0

    @property
    def ttft(self) -> float | None:
        return self.arrivals[0] - self.start if self.arrivals else None

    @property
    def e2e(self) -> float:
        return self.end - self.start


class Target(Protocol):
    """Something that streams a completion; ``stream`` yields the token count of each piece."""

    name: str

    def stream(self, index: int, max_tokens: int, record: RequestRecord) -> AsyncIterator[int]: ...


class EngineTarget:
    """The in-process engine: no HTTP, the engine's own streaming handle."""

    def __init__(self, engine: AsyncEngine, prompts: Sequence[Sequence[int]], *, name: str | None = None):
        self.engine = engine
        self.prompts = prompts
        self.name = name or f"{engine.backend_name} (in-process)"

    async def stream(self, index: int, max_tokens: int, record: RequestRecord) -> AsyncIterator[int]:
        params = GenerationParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        handle = await self.engine.submit(self.prompts[index % len(self.prompts)], params)
        try:
            async for out in handle:
                if out.token_id is not None:
                    yield 1
            result = await handle.result()
            record.output_tokens = result.usage.completion_tokens
            record.finish_reason = result.finish_reason.value
        finally:
            if record.finish_reason is None:
                handle.cancel()


class HttpTarget:
    """An OpenAI-compatible server's streaming ``/v1/completions``.

    Output tokens come from the final ``usage`` chunk when the server sends one
    (``stream_options.include_usage``), else one token per streamed chunk, which is how
    llama-cpp-python's and most servers stream.
    """

    def __init__(self, url: str, prompts: Sequence[str], *, model: str | None = None,
                 api_key: str | None = None, extra_body: dict[str, Any] | None = None,
                 name: str | None = None, include_usage: bool = True, timeout: float = 600.0):
        self.base = url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.prompts = prompts
        self.model = model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.extra_body = extra_body or {}
        self.include_usage = include_usage
        self.name = name or url
        self.timeout = timeout
        self._client = None

    async def __aenter__(self) -> HttpTarget:
        import httpx

        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=1024)
        self._client = httpx.AsyncClient(timeout=self.timeout, limits=limits)
        if self.model is None:
            r = await self._client.get(self.base + "/models", headers=self.headers)
            r.raise_for_status()
            self.model = r.json()["data"][0]["id"]
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._client is not None:
            await self._client.aclose()

    async def stream(self, index: int, max_tokens: int, record: RequestRecord) -> AsyncIterator[int]:
        assert self._client is not None, "use `async with HttpTarget(...)`"
        body = {"model": self.model, "prompt": self.prompts[index % len(self.prompts)],
                "max_tokens": max_tokens, "temperature": 0.0, "stream": True, **self.extra_body}
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        chunks = 0
        async with self._client.stream("POST", self.base + "/completions", json=body,
                                       headers=self.headers) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                raise RuntimeError(f"HTTP {resp.status_code}: {text[:200]}")
            async for payload in sse_data(resp.aiter_raw()):
                if payload == b"[DONE]":
                    break
                event = json.loads(payload)
                if "error" in event:
                    raise RuntimeError(f"server error mid-stream: {event['error']}")
                if event.get("usage"):
                    record.output_tokens = event["usage"]["completion_tokens"]
                for choice in event.get("choices") or ():
                    if choice.get("text"):
                        chunks += 1
                        yield 1
                    if choice.get("finish_reason"):
                        record.finish_reason = choice["finish_reason"]
        if not record.output_tokens:
            record.output_tokens = chunks


class PromptTarget(Target, Protocol):
    """A :class:`Target` over a list of prompts (:class:`HttpTarget`, :class:`EngineTarget`)."""

    prompts: Sequence[Any]


class EachPromptOnce:
    """``target`` with every request it is sent, from :func:`sweep`'s warm-up through every level,
    given the next of its prompts: no prompt is sent twice, so a server's prefix cache never
    meets one again (the warm-up's prompts are never measured). More requests than prompts is an
    error, not a repeat.
    """

    def __init__(self, target: PromptTarget):
        self.target = target
        self.name = target.name
        self.prompts = len(target.prompts)
        self.sent = 0

    async def stream(self, index: int, max_tokens: int, record: RequestRecord) -> AsyncIterator[int]:
        taken, self.sent = self.sent, self.sent + 1
        if taken >= self.prompts:
            raise RuntimeError(f"{self.name}: request {taken + 1} of a run with {self.prompts} prompts, "
                               "each to be sent once")
        async for piece in self.target.stream(taken, max_tokens, record):
            yield piece


async def sse_data(raw: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """The payload of every ``data:`` line of a server-sent event stream, as the bytes arrive.

    The client shares the cores with the server it measures, so it splits the raw body itself
    (LF or CRLF line ends, lines split across reads) instead of decoding it to text line by line.
    """
    pending = b""
    async for piece in raw:
        lines = (pending + piece).split(b"\n")
        pending = lines.pop()
        for line in lines:
            if line.startswith(b"data:"):
                yield line[5:].strip()
    if pending.startswith(b"data:"):
        yield pending[5:].strip()


@attrs.frozen(kw_only=True)
class ServingConfig:
    concurrency: int
    num_requests: int
    max_tokens: int = 64
    prompt_length: int = 128
    #: Requests per second (Poisson arrivals); inf sends whenever a slot is free.
    request_rate: float = math.inf
    seed: int = 0

    def __attrs_post_init__(self) -> None:
        for name in ("concurrency", "num_requests", "max_tokens", "prompt_length"):
            if getattr(self, name) < 1:
                raise InvalidRequest(name.replace("_", "-"), f"must be at least 1, got {getattr(self, name)}")
        if not self.request_rate > 0:
            raise InvalidRequest("request-rate", f"must be > 0 requests/s, got {self.request_rate}")


async def run_serving(target: Target, cfg: ServingConfig,
                      progress: Callable[[int, int], None] | None = None) -> dict[str, Any]:
    """Send ``num_requests`` streaming requests; return per-request records and aggregates."""
    rng = random.Random(cfg.seed)
    gate = asyncio.Semaphore(cfg.concurrency)
    records = [RequestRecord() for _ in range(cfg.num_requests)]
    done = 0
    t0 = time.perf_counter()

    def now() -> float:
        return time.perf_counter() - t0

    async def one(i: int) -> None:
        nonlocal done
        rec = records[i]
        async with gate:
            rec.start = now()
            try:
                async for _ in target.stream(i, cfg.max_tokens, rec):
                    rec.arrivals.append(now())
            except Exception as exc:  # recorded, counted and shown: a failed request is a result
                rec.error = f"{type(exc).__name__}: {exc}"
            rec.end = now()
        done += 1
        if progress is not None:
            progress(done, cfg.num_requests)

    tasks = []
    for i in range(cfg.num_requests):
        tasks.append(asyncio.ensure_future(one(i)))
        if math.isfinite(cfg.request_rate) and i + 1 < cfg.num_requests:
            await asyncio.sleep(rng.expovariate(cfg.request_rate))
    await asyncio.gather(*tasks)
    duration = now()
    return aggregate(target.name, cfg, records, duration)


def aggregate(name: str, cfg: ServingConfig, records: Sequence[RequestRecord],
              duration: float) -> dict[str, Any]:
    ok = [r for r in records if r.error is None]
    ttft = [r.ttft for r in ok if r.ttft is not None]
    itl = [b - a for r in ok for a, b in zip(r.arrivals, r.arrivals[1:], strict=False)]
    tpot = [(r.e2e - r.ttft) / (r.output_tokens - 1) for r in ok
            if r.ttft is not None and r.output_tokens > 1]
    output_tokens = sum(r.output_tokens for r in ok)
    # Asked for max_tokens with EOS ignored: anything shorter that did not stop on its own was cut.
    cut_short = sum(1 for r in ok if r.output_tokens < cfg.max_tokens and r.finish_reason != "stop")
    return {
        "target": name,
        "concurrency": cfg.concurrency,
        "request_rate": cfg.request_rate if math.isfinite(cfg.request_rate) else "inf",
        "num_requests": cfg.num_requests,
        "max_tokens": cfg.max_tokens,
        "prompt_length": cfg.prompt_length,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        "cut_short": cut_short,
        "errors": sorted({r.error for r in records if r.error})[:5],
        "duration_s": duration,
        "output_tokens": output_tokens,
        "output_tok_s": output_tokens / duration if duration > 0 else 0.0,
        "request_per_s": len(ok) / duration if duration > 0 else 0.0,
        "ttft_s": summary(ttft),
        "tpot_s": summary(tpot),
        "itl_s": summary(itl),
        "e2e_s": summary([r.e2e for r in ok]),
    }


def sweep_requests(levels: Sequence[int], num_requests: Callable[[int], int], warmup: int = 1) -> int:
    """Requests :func:`sweep` sends over ``levels``, its warm-up's included: the prompts an
    :class:`EachPromptOnce` target needs for one sweep."""
    return warmup + sum(num_requests(c) for c in levels)


async def sweep(target: Target, levels: Sequence[int], *, num_requests: Callable[[int], int], max_tokens: int,
                prompt_length: int, request_rate: float = math.inf, warmup: int = 1,
                progress: Callable[[int, int, int], None] | None = None,
                measured: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run one ServingConfig per concurrency level against the same target, after a warmup.
    ``measured`` gets each level's result as soon as it is in: a long sweep that is stopped
    still shows what it measured."""
    results = []
    if warmup:  # first requests pay one-off costs (threads, allocations) that are not serving speed
        await run_serving(target, ServingConfig(concurrency=1, num_requests=warmup, max_tokens=4,
                                                prompt_length=prompt_length))
    for c in levels:
        cfg = ServingConfig(concurrency=c, num_requests=num_requests(c), max_tokens=max_tokens,
                            prompt_length=prompt_length, request_rate=request_rate)
        cb = (lambda d, n, c=c: progress(c, d, n)) if progress is not None else None
        results.append(await run_serving(target, cfg, cb))
        if measured is not None:
            measured(results[-1])
    return results
