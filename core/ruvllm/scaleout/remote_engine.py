"""An :class:`~ruvllm.serving.AsyncEngine` whose requests run on Ray Serve replicas.

The ingress serves the unchanged OpenAI app (``ruvllm.server.app.create_app``) over this proxy,
so the HTTP surface of ``ruvllm serve --ray`` is the single-process one by construction. What
stays in the ingress process: the tokenizer (the app detokenizes, counts and builds grammars
synchronously, so it must be local and the model's own: see ``tokenizer_host``), the model
info, and request bookkeeping. What crosses to a replica: embed calls and each
generation request, streamed back through ``DeploymentHandle.options(stream=True)``. A
constrained request's grammar processors cross as their recipes (``GuidedProcessor.recipe``,
the request's ``GrammarSpec``), which the replica rebuilds with its own tokenizer and grammar
engine: the ingress has compiled the grammar once already, so a bad schema is a 400 here,
before routing, and its cache makes that compile cheap when the schema is sent again. Prompts are
tokenized in the ingress (the same tokenizer), which saves a Ray round trip per request.

Faults: when the replica running a request dies, a request that has produced no token yet is
sent again (Serve routes it to a live replica), at most ``retries`` times in all (default once),
whether the replica died before accepting it or after; one that has streamed tokens fails with a
``BackendError`` saying so, because its client has already seen part of an answer. Serve
restarts the dead replica on its own. The dead replica's gauges (running, waiting, KV) leave
``metrics()`` at once; its counters stay (see ``metrics_board.combine``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from ruvllm.engine.options import EngineOptions
from ruvllm.errors import BackendError, FeedbackNotFound, InvalidRequest, RuvllmError
from ruvllm.guided.grammar import GrammarSpec
from ruvllm.guided.processor import GuidedProcessor
from ruvllm.scaleout.metrics_board import STALE_AFTER, ReplicaMetrics, combine, current
from ruvllm.scaleout.prefix_router import prefix_key, tenant_key
from ruvllm.scaleout.wire import (
    Accepted,
    FeedbackCall,
    ReplicaDescription,
    ReplicaRequest,
    WireError,
    unpack_error,
)
from ruvllm.serving import MetricsSnapshot
from ruvllm.tokenizer import Tokenizer, require_prompt_text
from ruvllm.types import (
    Capabilities,
    FinishReason,
    GenerationParams,
    GenerationResult,
    ModelInfo,
    Timings,
    TokenOutput,
    Usage,
)

log = logging.getLogger(__name__)

_END = object()
#: Finished requests whose replica the ingress remembers, for feedback (SONA keeps 4,096 by
#: default per replica: ``[sona] capacity``).
FEEDBACK_MEMORY = 16384


def _replica_lost(exc: BaseException) -> bool:
    """True for the errors Ray raises when the replica serving a call died or went away."""
    from ray.exceptions import ActorUnavailableError, RayActorError

    return isinstance(exc, (RayActorError, ActorUnavailableError))


def _raise_if_error(value: Any) -> Any:
    if isinstance(value, WireError):
        raise unpack_error(value)
    return value


def _recipes(processors: Sequence[Any]) -> tuple[GrammarSpec, ...]:
    """The picklable recipes of a request's grammar processors, which the replica rebuilds with
    its own tokenizer (a processor's matcher is native state of this process). Any other logits
    processor is refused: its state cannot follow the request to the process that samples."""
    recipes = []
    for proc in processors:
        recipe = proc.recipe if isinstance(proc, GuidedProcessor) else None
        if recipe is None:
            raise InvalidRequest(
                "logits_processors", f"a {type(proc).__name__} is not available through `ruvllm serve "
                "--ray`: only grammar processors built by ruvllm.guided.guided_processor (which carry "
                "a picklable recipe) can be rebuilt in the replica that samples; run custom "
                "processors on a single-process engine")
        recipes.append(recipe)
    return tuple(recipes)


class RemoteRequestHandle:
    """One request running on a replica (implements :class:`ruvllm.serving.RequestHandle`)."""

    def __init__(self, engine: RemoteEngine, request: ReplicaRequest, stream: Any, accepted: Accepted,
                 resends: int):
        self.request_id = request.request_id
        #: The replica (Serve id) and process now running the request.
        self.replica_id = accepted.replica_id
        self.pid = accepted.pid
        #: Resends of this request still allowed if its replica dies before its first token (what
        #: ``_open`` left of ``RemoteEngine.retries``: one budget for the whole request).
        self._resends = resends
        self._engine = engine
        self._request = request
        self._stream = stream
        self._queue: asyncio.Queue[object] = asyncio.Queue()
        self._future: asyncio.Future[GenerationResult] = asyncio.get_running_loop().create_future()
        self._future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._outputs: list[TokenOutput] = []
        self._started = time.monotonic()
        self._task = asyncio.ensure_future(self._pump())

    async def _pump(self) -> None:
        engine = self._engine
        engine._running_on(self.replica_id, +1)
        try:
            while True:
                try:
                    await self._read(self._stream)
                    return
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    if not _replica_lost(exc):
                        self._fail(BackendError(f"request {self.request_id} failed on replica "
                                                f"{self.replica_id}: {exc}"))
                        return
                    engine._replica_died(self.replica_id)
                    if self._outputs or self._resends <= 0:
                        engine.died_mid_stream += 1
                        self._fail(BackendError(
                            f"request {self.request_id}: replica {self.replica_id} (pid {self.pid}) died "
                            f"after streaming {len(self._outputs)} tokens; Ray Serve restarts it, but this "
                            "request cannot be resumed; send it again"))
                        return
                    self._resends -= 1
                    engine.resent += 1
                    log.warning("replica %s died before request %s produced a token; sending it again",
                                self.replica_id, self.request_id)
                    try:
                        self._stream, accepted, self._resends = await engine._open(self._request,
                                                                                  self._resends)
                    except Exception as reopen:
                        self._fail(reopen if isinstance(reopen, RuvllmError) else BackendError(
                            f"request {self.request_id}: sending it again failed: {reopen}"))
                        return
                    engine._running_on(self.replica_id, -1)
                    self.replica_id, self.pid = accepted.replica_id, accepted.pid
                    engine._running_on(self.replica_id, +1)
        finally:
            engine._running_on(self.replica_id, -1)
            self._queue.put_nowait(_END)

    async def _read(self, stream: Any) -> None:
        async for batch in stream:
            if isinstance(batch, Accepted):
                continue
            _raise_if_error(batch)
            for item in batch:
                if isinstance(item, TokenOutput):
                    self._outputs.append(item)
                    self._queue.put_nowait(item)
                elif isinstance(item, GenerationResult):
                    if not self._future.done():
                        self._future.set_result(item)
                        self._engine._served_by(self.request_id, self.replica_id)
                elif isinstance(item, WireError):
                    self._fail(unpack_error(item))
        if not self._future.done():
            self._fail(BackendError(f"request {self.request_id}: the replica's stream ended without a "
                                    "result"))

    def _fail(self, exc: RuvllmError) -> None:
        if not self._future.done():
            self._future.set_exception(exc)

    def __aiter__(self) -> AsyncIterator[TokenOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[TokenOutput]:
        while True:
            item = await self._queue.get()
            if item is _END:
                if self._future.done() and not self._future.cancelled() and self._future.exception():
                    raise self._future.exception()  # type: ignore[misc]
                return
            yield item  # type: ignore[misc]

    async def result(self) -> GenerationResult:
        return await asyncio.shield(self._future)

    def cancel(self) -> None:
        """Cancel the replica's stream (Serve cancels the replica's generator, which cancels the
        engine request and frees its KV); ``result()`` then says ``cancelled``."""
        if self._future.done():
            return
        self._stream.cancel()
        self._task.cancel()
        out = self._outputs
        ids = tuple(o.token_id for o in out if o.token_id is not None)
        self._future.set_result(GenerationResult(
            text="".join(o.text for o in out), token_ids=ids, finish_reason=FinishReason.CANCELLED,
            usage=Usage(prompt_tokens=len(self._request.prompt_ids), completion_tokens=len(ids)),
            timings=Timings(decode=time.monotonic() - self._started)))

    @property
    def done(self) -> bool:
        return self._future.done()


class RemoteEngine:
    """AsyncEngine over the replica deployment's handle (see the module docstring)."""

    path: str

    def __init__(self, replicas: Any, description: ReplicaDescription, tokenizer: Tokenizer, *,
                 options: EngineOptions, affinity_blocks: int = 3, retries: int = 1,
                 board: Any = None, baseline: MetricsSnapshot | None = None, owner: Any = None,
                 stale_after: float = STALE_AFTER, tenant_affinity: bool = False):
        self._replicas = replicas
        self._stream_handle = replicas.options(stream=True)
        self._desc = description
        self._tokenizer = tokenizer
        #: The replicas' engine options (``priority`` requests read ``options.policy``).
        self.options = options
        self.affinity_blocks = affinity_blocks
        #: Route every request of a tenant (``GenerationParams.tenant``) to one replica instead of
        #: by prefix: the replica whose learning plugin holds the tenant's adapter (see submit).
        self.tenant_affinity = tenant_affinity
        #: Times a request is sent again when its replica dies before its first token, in all.
        self.retries = retries
        #: Seconds after which a replica's last report stops counting for the gauges.
        self.stale_after = stale_after
        self.path = description.path
        self._board = board
        self._baseline = baseline
        self._latest: dict[str, ReplicaMetrics] = {}
        #: Requests of this ingress running on each replica, and when a replica was seen dying.
        self._running: collections.Counter[str] = collections.Counter()
        self._lost: dict[str, float] = {}
        #: Requests sent again after their replica died before their first token, and requests
        #: failed because it died after (``/ray/replicas`` shows both).
        self.resent = 0
        self.died_mid_stream = 0
        #: Which replica served each of the last ``FEEDBACK_MEMORY`` finished requests.
        self._served: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._refresher: asyncio.Task | None = None
        #: What keeps the tokenizer valid (the ingress's tokenizer backend), closed at shutdown.
        self._owner = owner
        self._tokenizer_thread = ThreadPoolExecutor(1, thread_name_prefix="ruvllm-tokenizer")

    # ------------------------------------------------------------------ AsyncEngine properties
    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def info(self) -> ModelInfo:
        return self._desc.info

    @property
    def capabilities(self) -> Capabilities:
        return self._desc.capabilities

    @property
    def backend_name(self) -> str:
        return self._desc.backend_name

    @property
    def scheduling_policy(self) -> str:
        return self._desc.policy

    @property
    def guided_decoding_backend(self) -> str:
        return self.options.guided_decoding_backend

    @property
    def context_limit_note(self) -> str:
        return self._desc.context_limit_note

    @property
    def backend_choice(self) -> str | None:
        return self._desc.backend_choice

    def memory_summary(self) -> str | None:
        return f"each replica: {self._desc.memory}" if self._desc.memory else None

    def adapters(self) -> None:
        """None: a Serve handle reaches one replica per call, not each of them, so an adapter
        loaded through it would exist on one replica only (``ruvllm serve --ray`` refuses
        ``--allow-runtime-lora`` at start for that reason)."""
        return None

    def feedback(self, request_id: str, score: float) -> Awaitable[None]:
        """Deliver the score to the replica that served ``request_id``, where its learning plugin
        (SONA) keeps the request: this ingress remembers the replica of each finished request,
        and the router sends the call there. Unknown here (not served by this ingress, or more
        than ``FEEDBACK_MEMORY`` requests ago) or its replica died: ``FeedbackNotFound`` at once."""
        replica = self._served.get(request_id)
        if replica is None:
            raise FeedbackNotFound(f"no finished request {request_id!r} was served through this ingress "
                                   f"(or it was more than {FEEDBACK_MEMORY} requests ago)")
        if replica in self._lost:
            raise FeedbackNotFound(f"request {request_id!r} was served by replica {replica}, which has "
                                   "died since, and its learning state with it")
        return self._deliver(FeedbackCall(request_id=request_id, score=score, replica_id=replica))

    async def _deliver(self, call: FeedbackCall) -> None:
        _raise_if_error(await self._replicas.feedback.remote(call))

    def _served_by(self, request_id: str, replica_id: str) -> None:
        self._served[request_id] = replica_id
        self._served.move_to_end(request_id)
        while len(self._served) > FEEDBACK_MEMORY:
            self._served.popitem(last=False)

    # ------------------------------------------------------------------ calls
    async def encode_async(self, text: str, *, add_special: bool = True,
                           parse_special: bool = False) -> list[int]:
        """Tokenized here, on the ingress's one tokenizer thread, with the model's own tokenizer
        (the one the replicas use): a round trip to a replica per prompt would add a routed Ray
        call to every request's time to first token."""
        require_prompt_text(text)
        return await asyncio.get_running_loop().run_in_executor(
            self._tokenizer_thread, lambda: self._tokenizer.encode(
                text, add_special=add_special, parse_special=parse_special))

    async def embed_async(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        return _raise_if_error(await self._replicas.embed.remote([list(i) for i in inputs]))

    async def submit(self, prompt_ids: Sequence[int], params: GenerationParams, *,
                     request_id: str | None = None, priority: int = 0, timeout: float | None = None,
                     cache_salt: str | None = None,
                     logits_processors: Sequence[Any] = (),
                     prediction: Sequence[int] = ()) -> RemoteRequestHandle:
        grammars = _recipes(logits_processors)
        self._ensure_refresher()
        request = ReplicaRequest(
            prompt_ids=tuple(int(t) for t in prompt_ids), params=params,
            request_id=request_id or f"ray-{time.monotonic_ns():x}", priority=priority, timeout=timeout,
            cache_salt=cache_salt, grammars=grammars, prediction=tuple(int(t) for t in prediction),
            prefix_key=self._key(prompt_ids, params, cache_salt))
        stream, accepted, resends = await self._open(request, self.retries)
        return RemoteRequestHandle(self, request, stream, accepted, resends)

    def _key(self, prompt_ids: Sequence[int], params: GenerationParams, cache_salt: str | None) -> str | None:
        """The request's routing key: its tenant's with ``tenant_affinity`` (so the tenant's
        requests, and the feedback on them, meet the one adapter SONA learns for it on that
        replica), else its prompt's first KV blocks."""
        if self.tenant_affinity and params.tenant:
            return tenant_key(params.tenant)
        return prefix_key(prompt_ids, block_size=self._desc.block_size, blocks=self.affinity_blocks,
                          cache_salt=cache_salt)

    async def _open(self, request: ReplicaRequest, resends: int) -> tuple[Any, Accepted, int]:
        """Start ``request`` on a replica and wait until its engine accepted it (so submission
        errors are raised here, with their status codes, as the in-process engine does).

        A replica that dies before accepting it costs one of ``resends``; the stream, the
        acceptance and the resends left are returned, for the request's handle to spend the
        rest if its replica dies later."""
        while True:
            stream = self._stream_handle.generate.remote(request)
            try:
                first = _raise_if_error(await stream.__anext__())
            except StopAsyncIteration:
                raise BackendError(f"request {request.request_id}: the replica closed its stream "
                                   "before accepting the request") from None
            except Exception as exc:
                if not _replica_lost(exc):
                    raise
                if resends > 0:
                    resends -= 1
                    self.resent += 1
                    log.warning("a replica died before accepting request %s; sending it again",
                                request.request_id)
                    continue
                raise BackendError(f"request {request.request_id}: no replica could take it ({exc}); "
                                   "Ray Serve is restarting replicas, retry shortly") from exc
            if not isinstance(first, Accepted):
                raise BackendError(f"request {request.request_id}: unexpected first item {first!r}")
            return stream, first, resends

    # ------------------------------------------------------------------ metrics
    def _ensure_refresher(self) -> None:
        if self._refresher is not None and not self._refresher.done():
            return
        with contextlib.suppress(RuntimeError):  # no running loop: refresh_metrics() on demand
            self._refresher = asyncio.get_running_loop().create_task(self._refresh_forever())

    async def _refresh_forever(self, period: float = 1.0) -> None:
        while True:
            try:
                await self.refresh_metrics()
            except Exception as exc:  # the board restarts with the ingress; keep the last view
                log.debug("metrics board unavailable: %s", exc)
            await asyncio.sleep(period)

    async def refresh_metrics(self) -> dict[str, ReplicaMetrics]:
        """The latest metrics of every replica that has reported (also cached for ``metrics()``).
        Without a board (a single local replica, as in Serve's local testing mode) the replica
        is asked directly."""
        if self._board is not None:
            self._latest = await self._board.latest.remote()
        else:
            snapshot = await self._replicas.metrics.remote()
            self._latest = {self._desc.replica_id: ReplicaMetrics(
                replica_id=self._desc.replica_id, pid=self._desc.pid, snapshot=snapshot,
                reported_at=time.time())}
        return dict(self._latest)

    def running_by_replica(self) -> dict[str, int]:
        """Requests of this ingress that a replica has accepted and not finished, by replica id:
        where they are now (the replicas' own reports come when a request ends)."""
        return dict(self._running)

    def _running_on(self, replica_id: str, change: int) -> None:
        self._running[replica_id] += change
        if self._running[replica_id] <= 0:
            del self._running[replica_id]

    def _replica_died(self, replica_id: str) -> None:
        self._lost[replica_id] = time.time()

    def metrics(self) -> MetricsSnapshot:
        """Sum over the replicas' latest reports: the counters of every replica that reported,
        dead ones included; the gauges (running, waiting, KV) of the replicas still alive, those
        that reported within ``stale_after`` seconds or run a request of ours, and that no
        stream has seen die since their report (``metrics_board.current``)."""
        self._ensure_refresher()
        alive = current(self._latest, now=time.time(), stale_after=self.stale_after,
                        busy=set(self._running), lost=self._lost)
        combined = combine([m.snapshot for m in self._latest.values()], [m.snapshot for m in alive])
        if combined is not None:
            return combined
        if self._baseline is None:
            raise BackendError("no replica has reported metrics yet")
        return self._baseline

    async def shutdown(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
        self._tokenizer_thread.shutdown(wait=False)
        close = getattr(self._owner, "close", None)
        if callable(close):
            close()
