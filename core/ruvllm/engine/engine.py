"""ServingEngine: many concurrent requests, one model thread, one forward pass per step.

Callers (asyncio handlers, scripts) never call the backend. They post messages to a thread-safe
inbox; the model thread drains it between steps, runs the step, and pushes outputs back through
each request's sink. Every backend call (load, executor creation, each forward pass,
detokenization) happens on that one thread, which is what llama.cpp's OpenMP build needs for
full speed, and no lock is held by a request handler while a forward pass runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from ruvllm.adapters import AdapterHost, adapter_cache_key
from ruvllm.backend import LlmBackend, request_sampler
from ruvllm.config import Config, merged_options
from ruvllm.embeddings import check_embedding_inputs, token_chunks
from ruvllm.engine.draft_model import DraftModel
from ruvllm.engine.executor_core import ExecutorCore
from ruvllm.engine.handles import AsyncSink, RequestHandle, Sink, SyncRequestHandle, SyncSink
from ruvllm.engine.live import LiveRequest
from ruvllm.engine.metrics import EngineMetrics
from ruvllm.engine.options import EngineOptions
from ruvllm.engine.prompt_logprobs import PromptLogprobsCollector, check_logits_options
from ruvllm.engine.published_adapters import PublishedAdapters
from ruvllm.engine.request import SchedRequest
from ruvllm.engine.request_level import RequestLevelCore
from ruvllm.errors import (
    BackendError,
    BatchInvariantUnsupported,
    EngineClosed,
    EngineOptionError,
    InvalidRequest,
    Overloaded,
)
from ruvllm.generation import RequestOutputBuilder, check_prompt, require_core_sampler
from ruvllm.process_memory import release_freed_memory
from ruvllm.sampling import LogitsProcessor
from ruvllm.serving import MetricsSnapshot, PluginMetric
from ruvllm.tokenizer import Tokenizer, require_in_vocabulary, require_prompt_text
from ruvllm.types import Capabilities, FinishReason, GenerationParams, GenerationResult, ModelInfo, Trajectory

log = logging.getLogger(__name__)

BackendSource = LlmBackend | Callable[[], LlmBackend]
_STOP = ("stop",)
#: A prompt up to this many characters is tokenized right on the caller's event loop when the
#: tokenizer is ``thread_safe`` (llama.cpp's: about 0.2 ms, 0.35 us a character on the 2-core
#: AVX2 EPYC, no more than a hop to another thread costs); a longer one on a worker thread.
INLINE_ENCODE_CHARS = 512


class ServingEngine:
    """Implements :class:`ruvllm.serving.AsyncEngine`.

    ``backend`` is a loaded backend or a zero-argument factory; with a factory the model is
    loaded on the model thread itself and closed by :meth:`shutdown` (``owns_backend``).
    ``draft`` (``speculative_method = "draft_model"``): the draft model as a loaded backend (kept
    open) or a factory (closed at shutdown); None loads ``speculative_model`` through the
    registry (:mod:`ruvllm.engine.draft_model`).
    """

    def __init__(self, backend: BackendSource, options: EngineOptions | None = None, *,
                 owns_backend: bool | None = None, hooks: Any = None, draft: BackendSource | None = None,
                 config: Config | None = None, registry: Any = None):
        """``config`` and ``registry`` resolve and load the draft model (default: the process's)."""
        self.options = options or EngineOptions()
        #: Why ``backend = "auto"`` picked this engine's backend (set by :meth:`from_config`); None
        #: when the backend was named or given.
        self.backend_choice: str | None = None
        self._draft_source = (draft, config, registry)
        # The plugins' hook relay (request_finished, select_adapter: e.g. SONA's instant loop
        # and adapter router); None: the process-wide registry's.
        self._hooks = hooks
        self._owns_backend = (not isinstance(backend, LlmBackend)) if owns_backend is None else owns_backend
        self._inbox: queue.SimpleQueue[tuple[Any, ...]] = queue.SimpleQueue()
        self._metrics = EngineMetrics()
        # Guards the admission counters only; never held while the model runs.
        self._lock = threading.Lock()
        self._queued = 0
        self._active: set[str] = set()
        self._closed = False
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self._thread = threading.Thread(target=self._main, args=(backend,), name="ruvllm-model", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._startup_error is not None:
            self._thread.join()
            raise self._startup_error

    @classmethod
    def from_config(cls, config: Config | None = None, *, model: str | None = None,
                    backend: str | None = None, options: EngineOptions | Mapping[str, Any] | None = None,
                    registry: Any = None) -> ServingEngine:
        """Resolve the model and backend as :class:`ruvllm.LLM` does and load it on the model
        thread; engine options come from ``options``, else the config's ``[engine]`` table."""
        from ruvllm.config import load_config
        from ruvllm.plugins import get_registry
        from ruvllm.registry import resolve

        config = config or load_config()
        registry = registry or get_registry()
        source = resolve(model or config.model, config.cache_dir)
        if options is None:
            options = EngineOptions.from_mapping(getattr(config, "engine", {}) or {})
        elif not isinstance(options, EngineOptions):
            options = EngineOptions.from_mapping(options)
        name, choice = backend or config.backend, None
        if name == "auto":
            # `auto` picks for the load this engine is sized for: max_num_seqs clients.
            choice = registry.auto_choice(source, load=options.max_num_seqs, cache_dir=config.cache_dir)
            name = choice.name
        backend_cls = registry.select(name, source)
        backend_opts = merged_options(config, backend_cls.name)
        engine = cls(lambda: backend_cls.load(source, backend_opts), options, owns_backend=True,
                     hooks=registry.pm.hook, config=config, registry=registry)
        engine.backend_choice = None if choice is None else str(choice)
        try:
            # Plugins that act on a running engine (SONA) attach here, reading their own config.
            registry.pm.hook.ruvllm_engine_started(engine=engine, config=config)
        except BaseException:
            engine.close()
            raise
        return engine

    # ----------------------------------------------------------------- AsyncEngine properties

    @property
    def tokenizer(self) -> Tokenizer:
        return self._backend.tokenizer

    @property
    def info(self) -> ModelInfo:
        """The backend's model info, with ``context_length`` lowered to what the engine's KV
        capacity lets one request use."""
        return self._info

    @property
    def capabilities(self) -> Capabilities:
        return self._caps

    @property
    def backend_name(self) -> str:
        return self._backend.name

    @property
    def backend(self) -> LlmBackend:
        return self._backend

    @property
    def scheduling_policy(self) -> str:
        return str(self.options.policy.value)

    @property
    def guided_decoding_backend(self) -> str:
        return self.options.guided_decoding_backend

    def memory_summary(self) -> str | None:
        return self._backend.memory_summary()

    def adapters(self) -> PublishedAdapters | None:
        """Runtime LoRA changes on the backend (published between steps); None without LoRA."""
        backend = self._backend
        if isinstance(backend, AdapterHost) and hasattr(backend, "load_adapter") and self._caps.lora:
            return PublishedAdapters(self, backend)
        return None

    # ----------------------------------------------------------------- submission

    async def submit(self, prompt_ids: Sequence[int], params: GenerationParams, *,
                     request_id: str | None = None, priority: int = 0, timeout: float | None = None,
                     cache_salt: str | None = None,
                     logits_processors: Sequence[LogitsProcessor] = (),
                     prediction: Sequence[int] = ()) -> RequestHandle:
        """Queue one request; ``logits_processors`` rewrite its logits before each choice (core's
        sampler runs them, so they need the executor path); ``prediction`` is the answer the
        client expects, as token ids, verified as drafts (OpenAI's Predicted Outputs)."""
        sink = AsyncSink(asyncio.get_running_loop())
        rid = self._enqueue(prompt_ids, params, sink, request_id, priority, timeout, cache_salt,
                            logits_processors, prediction)
        return RequestHandle(rid, sink, self._cancel)

    def submit_sync(self, prompt_ids: Sequence[int], params: GenerationParams, *,
                    request_id: str | None = None, priority: int = 0, timeout: float | None = None,
                    cache_salt: str | None = None,
                    logits_processors: Sequence[LogitsProcessor] = (),
                    prediction: Sequence[int] = ()) -> SyncRequestHandle:
        """:meth:`submit` for plain threads: the handle iterates and waits without asyncio."""
        sink = SyncSink()
        rid = self._enqueue(prompt_ids, params, sink, request_id, priority, timeout, cache_salt,
                            logits_processors, prediction)
        return SyncRequestHandle(rid, sink, self._cancel)

    def generate_sync(self, prompts: Sequence[str | Sequence[int]], params: GenerationParams | None = None,
                      *, priority: int = 0) -> list[GenerationResult]:
        """Submit every prompt at once (they are batched together) and wait for all results."""
        params = params or GenerationParams()
        handles = [
            self.submit_sync(self.encode(p) if isinstance(p, str) else p, params, priority=priority)
            for p in prompts
        ]
        return [h.result() for h in handles]

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Tokenize on the model thread (the backend's tokenizer is the model's), or right here
        when the tokenizer says it is ``thread_safe``."""
        require_prompt_text(text)
        tokenizer = self._backend.tokenizer
        if getattr(tokenizer, "thread_safe", False):
            self._check_open()
            return tokenizer.encode(text, add_special=add_special, parse_special=parse_special)
        return self.call(lambda: tokenizer.encode(text, add_special=add_special, parse_special=parse_special))

    async def encode_async(self, text: str, *, add_special: bool = True,
                           parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, never computed on a busy event loop.

        A tokenizer that may run beside a forward pass (``thread_safe = True``: llama.cpp's, as
        llama-server tokenizes on its HTTP threads) tokenizes a short prompt on the loop and a
        long one on a worker thread. Any other runs on the model thread between two steps: a
        request arriving mid-step then waits for that step to tokenize and for the next to be
        admitted, a whole step more before its first token (at 16 clients, a step of 16 rows)."""
        require_prompt_text(text)
        tokenizer = self._backend.tokenizer
        if getattr(tokenizer, "thread_safe", False):
            self._check_open()
            if len(text) <= INLINE_ENCODE_CHARS:
                return tokenizer.encode(text, add_special=add_special, parse_special=parse_special)
            return await asyncio.to_thread(tokenizer.encode, text, add_special=add_special,
                                           parse_special=parse_special)
        fut = self.call_future(lambda: tokenizer.encode(
            text, add_special=add_special, parse_special=parse_special))
        return await asyncio.wrap_future(fut)

    async def embed_async(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """L2-normalised embeddings of ``inputs`` (token-id lists), ``[len(inputs), dim]``.

        Computed on the model thread in chunks of at most ``max_batch_tokens`` tokens, each
        between two generation steps (``LlmBackend.embed_batch``): a request embedding thousands
        of documents delays the running requests by one chunk at a time, as a long prompt's
        chunked prefill does, never by the whole request. Every input is checked first, so a bad
        one refuses the request before any chunk runs."""
        parts = [await asyncio.wrap_future(self._chunk_future(lambda c=chunk: self._backend.embed_batch(c)))
                 for chunk in self._embedding_chunks(inputs)]
        return np.concatenate(parts)

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """:meth:`embed_async` for plain threads."""
        return np.concatenate([self._chunk_future(lambda c=chunk: self._backend.embed_batch(c)).result()
                               for chunk in self._embedding_chunks(inputs)])

    def _embedding_chunks(self, inputs: Sequence[Sequence[int]]) -> list[list[list[int]]]:
        if not self._caps.embeddings:
            raise InvalidRequest("model", f"{self._info.name!r} on backend {self.backend_name!r} cannot "
                                 "produce embeddings; serve it on a backend whose capabilities list "
                                 "embeddings (candle_like, llamacpp; see `ruvllm backends`)")
        batch = check_embedding_inputs(inputs, vocab_size=self._info.vocab_size,
                                       max_tokens=self._backend.max_embedding_tokens())
        return token_chunks(batch, self.options.max_batch_tokens)

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the model thread between steps and return its result."""
        return self.call_future(fn).result()

    def call_future(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        fut: concurrent.futures.Future = concurrent.futures.Future()
        if threading.current_thread() is self._thread:
            fut.set_result(fn())
            return fut
        self._check_open()
        self._inbox.put(("call", fn, fut))
        return fut

    def _chunk_future(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """:meth:`call_future` for one chunk of a long job: the running requests get a step
        before the model thread takes its next message, however soon the caller posts the next
        chunk (the event loop can post it before the model thread looks at its inbox again)."""
        if threading.current_thread() is self._thread:
            return self.call_future(fn)
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._check_open()
        self._inbox.put(("chunk", fn, fut))
        return fut

    def _enqueue(self, prompt_ids: Sequence[int], params: GenerationParams, sink: Sink,
                 request_id: str | None, priority: int, timeout: float | None, cache_salt: str | None,
                 logits_processors: Sequence[LogitsProcessor] = (), prediction: Sequence[int] = ()) -> str:
        self._check_open()
        if logits_processors:
            require_core_sampler(self.path, self.backend_name, "logits_processors", "a logits processor")
        predicted = self._checked_prediction(prediction)
        if not isinstance(params, GenerationParams):
            raise InvalidRequest("params", f"must be GenerationParams, got {type(params).__name__}")
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidRequest("priority", f"must be an integer (higher runs first), got {priority!r}",
                                 priority)
        if timeout is not None and (not isinstance(timeout, (int, float)) or timeout <= 0):
            raise InvalidRequest("timeout", f"must be a number of seconds > 0, got {timeout!r}", timeout)
        prompt = [int(t) for t in prompt_ids]
        check_prompt(prompt, params, self._info.context_length, self._info.vocab_size,
                     limit_note=self.context_limit_note)
        check_logits_options(params, path=self.path, backend=self.backend_name,
                             vocab_size=self._info.vocab_size, executor=getattr(self._core, "executor", None))
        if params.adapter is None and self._router_active():
            chosen = self._hooks.ruvllm_select_adapter(engine=self, prompt_ids=tuple(prompt), embedding=None,
                                                       tenant=params.tenant)
            if chosen is not None:
                params = attrs.evolve(params, adapter=chosen)
        # Refused here, never mid-batch; the key keeps KV of different adapters (or of another
        # version of one) apart in the prefix cache.
        adapter_key = adapter_cache_key(self._backend, params.adapter)
        if adapter_key is not None:
            cache_salt = f"{cache_salt or ''}\x00adapter:{adapter_key}"
        invariant_rows = self._invariant_rows(params)
        if invariant_rows:
            # Its KV is computed by other kernels: it may only meet blocks computed by them.
            cache_salt = f"{cache_salt or ''}\x00batch_invariant"
        rid = request_id or uuid.uuid4().hex
        with self._lock:
            if rid in self._active:
                raise InvalidRequest("request_id", f"{rid!r} is already in flight; use a unique id", rid)
            if self._queued >= self.options.max_queue:
                raise Overloaded(
                    f"the engine's queue is full ({self.options.max_queue} waiting requests); retry "
                    "later or raise [engine] max_queue", retry_after=1.0,
                )
            self._queued += 1
            self._active.add(rid)
        sched = SchedRequest(rid, prompt, params.max_tokens, priority=priority, arrival=time.monotonic(),
                             cache_salt=cache_salt, reuse_prefix=params.prompt_logprobs is None,
                             prediction=predicted, invariant=invariant_rows)
        tokenizer = self._backend.tokenizer
        sampler = request_sampler(params, self._info.vocab_size, prompt, tokenizer, logits_processors) \
            if self.path == "executor" else None
        live = LiveRequest(sched, params, RequestOutputBuilder(tokenizer, prompt, params),
                           sampler, _Tracked(sink, self, rid, tuple(prompt), params.adapter, params.tenant),
                           arrival=time.perf_counter(),
                           timeout=timeout if timeout is not None else self.options.request_timeout)
        if params.prompt_logprobs is not None:
            live.prompt_logprobs = PromptLogprobsCollector(prompt, params.prompt_logprobs,
                                                           self._backend.tokenizer)
        self._inbox.put(("add", live))
        return rid

    def _invariant_rows(self, params: GenerationParams) -> bool:
        """Whether a request's rows must run through the executor's batch-invariant kernels:
        it asks for the guarantee and the engine does not give it to every request already.
        Refused when nothing here can keep it."""
        if not params.batch_invariant or self._caps.batch_invariant:
            return False
        if self.path == "request" and not self._caps.concurrent_requests:
            return False  # one request at a time: nothing shares its forward passes
        executor = getattr(self._core, "executor", None)
        if not getattr(executor, "invariant_rows", False):
            raise InvalidRequest("batch_invariant", f"this engine ({self.backend_name}, {self.path} path) "
                                 "cannot compute one request's rows apart from its batch; start it with "
                                 "[engine] batch_invariant = true (ruvllm serve --batch-invariant) to "
                                 "give every request the guarantee", True)
        if params.adapter is not None:
            raise InvalidRequest("batch_invariant", "a request with a LoRA adapter cannot have it on an "
                                 "engine built without the mode: adapter rows run on the default "
                                 "kernels", True)
        return True

    def _checked_prediction(self, prediction: Sequence[int]) -> tuple[int, ...]:
        """``prediction`` as token ids this engine can verify as drafts, or a refusal naming it."""
        ids = tuple(int(t) for t in prediction)
        if not ids:
            return ids
        if getattr(self._core, "speculator", None) is None:
            raise InvalidRequest("prediction", f"backend {self.backend_name!r} cannot verify drafted tokens "
                                 "(its engine gives no logits per drafted position, or it samples by "
                                 "itself), so a predicted output cannot be used; drop prediction or use a "
                                 "backend with an executor (llamacpp, candle_like, mlx)")
        require_in_vocabulary("prediction", ids, self._info.vocab_size)
        return ids

    def _cancel(self, request_id: str) -> None:
        if not self._closed:
            self._inbox.put(("cancel", request_id))

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosed("the engine is shut down; create a new ServingEngine")

    def _left_queue(self) -> None:
        with self._lock:
            self._queued -= 1

    def _released(self, request_id: str) -> None:
        with self._lock:
            self._active.discard(request_id)

    # ----------------------------------------------------------------- learning hooks

    def _router_active(self) -> bool:
        return self._hooks is not None and bool(self._hooks.ruvllm_select_adapter.get_hookimpls())

    def _finished(self, request_id: str, prompt: tuple[int, ...], adapter: str | None,
                  result: GenerationResult, tenant: str | None) -> None:
        """The ``ruvllm_request_finished`` hook, on the model thread, for every request that produced
        a result (learning plugins record the trajectory there)."""
        hook = self._hooks.ruvllm_request_finished if self._hooks is not None else None
        if hook is None or not hook.get_hookimpls():
            return
        try:
            hook(engine=self, trajectory=Trajectory(request_id=request_id, prompt_ids=prompt,
                                                    output_ids=result.token_ids, adapter=adapter,
                                                    tenant=tenant))
        except Exception:  # a learning plugin must never break serving
            log.exception("ruvllm_request_finished failed")

    @property
    def hooks(self) -> Any:
        """The plugin hook relay this engine calls (finished requests, feedback, adapter routing)."""
        return self._hooks

    def feedback(self, request_id: str, score: float) -> None:
        """A user's score in [-1, 1] for a finished request of this engine (see ruvllm.feedback)."""
        from ruvllm.feedback import send_feedback

        send_feedback(request_id, score, hooks=self._hooks)

    def publish(self, fn: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``fn`` (e.g. an adapter swap) on the model thread between two steps, so no forward
        pass sees it half done; the future completes once it has run."""
        return self.call_future(fn)

    # ----------------------------------------------------------------- metrics and shutdown

    def metrics(self) -> MetricsSnapshot:
        core = self._core
        queries, hits = core.prefix_counters()
        return self._metrics.snapshot(
            running=core.num_running, waiting=max(self._queued, 0) + core.num_requeued,
            kv_usage=core.kv_usage(), prefix_queries=queries, prefix_hits=hits,
            preemptions=core.preemptions(), kv_capacity_tokens=core.kv_capacity_tokens(),
            kv_used_tokens=core.kv_used_tokens(), prefix_cache_prompts=core.prefix_cache_prompts(),
            prefix_cache_host_bytes=core.prefix_cache_host_bytes(), plugins=self._plugin_metrics(),
        )

    def _plugin_metrics(self) -> tuple[PluginMetric, ...]:
        if self._hooks is None:  # before the model thread set the engine up: no plugin knows it yet
            return ()
        try:
            reported = self._hooks.ruvllm_engine_metrics(engine=self)
        except Exception:  # a plugin's bug must not take the engine's own metrics with it
            log.exception("a plugin's ruvllm_engine_metrics failed; its figures are left out")
            return ()
        return tuple(metric for batch in reported for metric in batch)

    async def shutdown(self) -> None:
        """Cancel what is still running, stop the model thread (closing an owned backend).

        The thread is polled, not joined from an executor thread: a caller that stops waiting
        (``asyncio.wait_for``, as the server does at exit while a backend call such as a long
        mistral.rs prefill cannot be interrupted) leaves no joining thread behind to hold the
        process open."""
        if self._stop():
            while self._thread.is_alive():
                await asyncio.sleep(0.02)

    def close(self) -> None:
        """:meth:`shutdown` for plain threads."""
        if self._stop():
            self._thread.join()

    def _stop(self) -> bool:
        if self._closed:
            return False
        self._closed = True
        self._inbox.put(_STOP)
        return True

    def __enter__(self) -> ServingEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------- the model thread

    def _main(self, source: BackendSource) -> None:
        try:
            self._setup(source)
        except BaseException as exc:
            self._startup_error = exc
            backend = getattr(self, "_backend", None)
            if backend is not None and self._owns_backend:
                backend.close()
            self._ready.set()
            return
        self._ready.set()
        try:
            self._loop()
        finally:
            self._teardown()

    def _setup(self, source: BackendSource) -> None:
        backend = source if isinstance(source, LlmBackend) else source()
        self._backend = backend
        if self._hooks is None:
            from ruvllm.plugins import get_registry

            self._hooks = get_registry().pm.hook
        caps = self._invariance(backend, backend.capabilities())
        want = self.options.path
        if want == "executor" and not caps.executor:
            raise EngineOptionError("path", f"backend {backend.name!r} has no executor; use auto or request")
        if want != "request" and caps.executor:
            opts = self.options
            per_sequence = getattr(backend, "executor_kv_layout", "paged") == "per_sequence"
            donors = (opts.donor_slots(getattr(backend, "prefix_donor_slots", LlmBackend.prefix_donor_slots),
                                       getattr(backend, "max_executor_sequences", None))
                      if opts.enable_prefix_caching and per_sequence else 0)
            # Only a backend offering the mode is asked for it: others keep their signature.
            mode = {"batch_invariant": True} if opts.batch_invariant and caps.batch_invariant_mode else {}
            executor = backend.create_executor(max_sequences=opts.max_num_seqs + donors,
                                               block_size=opts.block_size, **mode)
            if executor.kv_layout == "per_sequence" and not per_sequence and opts.prefix_donor_slots != 0:
                log.warning("backend %r returned a per_sequence executor but declares executor_kv_layout "
                            "%r: no prefix donor sequences were reserved, so cached prefixes die with "
                            "their requests; set executor_kv_layout = 'per_sequence' on the backend class",
                            backend.name, getattr(backend, "executor_kv_layout", "paged"))
            draft = None
            if opts.speculative_method == "draft_model" and getattr(executor, "prompt_logits", False):
                given, config, registry = self._draft_source
                draft = DraftModel.load(backend, opts.speculative_model, opts.speculative_draft_backend,
                                        max_sequences=opts.max_num_seqs, block_size=opts.block_size,
                                        draft=given, config=config, registry=registry)
            self._core: ExecutorCore | RequestLevelCore = ExecutorCore(executor, self.options, self._metrics,
                                                                       draft=draft)
        else:
            self._core = RequestLevelCore(backend, self.options, self._metrics)
        self.path = self._core.path
        self._caps = caps
        info = backend.info
        room = min(info.context_length, self._core.max_request_tokens())
        self._info = attrs.evolve(info, context_length=room, embedding_tokens=(
            backend.max_embedding_tokens() if caps.embeddings else None))
        #: Why one request gets less than the model's window here, for ContextLengthExceeded.
        self.context_limit_note = "" if room >= info.context_length else (
            f"this engine's KV capacity gives one request {room} of the model's {info.context_length} "
            f"tokens; raise the backend's KV budget ({backend.memory_summary() or 'see its options'})")
        log.info("serving %s on %s through the %s path", info.name, backend.name, self.path)
        # The load's transients are free now but still resident in this thread's arena.
        release_freed_memory()

    def _invariance(self, backend: LlmBackend, caps: Capabilities) -> Capabilities:
        """``caps`` as this engine serves them: ``batch_invariant`` when the option asks for it
        and the backend is invariant or offers the mode; a backend that cannot hold it is
        refused by name (served request by request, nothing shares a forward, so it holds)."""
        if not self.options.batch_invariant:
            return caps
        one_at_a_time = not caps.concurrent_requests and (self.options.path == "request" or not caps.executor)
        if not (caps.batch_invariant or caps.batch_invariant_mode or one_at_a_time):
            raise BatchInvariantUnsupported(backend.name, "its batched numerics depend on the batch and "
                                            "it offers no batch-invariant mode")
        return attrs.evolve(caps, batch_invariant=True)

    def _loop(self) -> None:
        core = self._core
        idle_wait = None
        while True:
            try:
                msg = self._inbox.get(timeout=self._wait_time(idle_wait)) if not core.has_work or idle_wait \
                    else self._inbox.get_nowait()
            except queue.Empty:
                msg = None
            while msg is not None:
                if msg is _STOP:
                    return
                self._handle(msg)
                if msg[0] == "chunk" and core.has_work:
                    break  # a step before the next message, which may be the job's next chunk
                try:
                    msg = self._inbox.get_nowait()
                except queue.Empty:
                    msg = None
            core.expire(time.perf_counter())
            idle_wait = None
            try:
                if core.has_work and not core.step():
                    idle_wait = 0.005  # blocked (e.g. waiting for blocks): do not spin
            except Exception as exc:
                # A bug or backend failure outside the forward pass: fail what is in flight
                # (every block is returned) rather than let the model thread die silently.
                log.exception("engine step failed")
                core.fail_all(BackendError(f"the engine step failed: {exc}"))

    def _wait_time(self, idle_wait: float | None) -> float | None:
        deadlines = [lv.deadline for lv in self._lives() if lv.deadline is not None]
        wait = idle_wait
        if deadlines:
            until = max(min(deadlines) - time.perf_counter(), 0.0)
            wait = until if wait is None else min(wait, until)
        return wait

    def _lives(self) -> list[LiveRequest]:
        core = self._core
        if isinstance(core, ExecutorCore):
            return list(core.live.values())
        return core.waiting + [lv for lv, _ in core.in_flight.values()]

    def _handle(self, msg: tuple[Any, ...]) -> None:
        kind = msg[0]
        if kind == "add":
            live = msg[1]
            if live.builder.finished and live.prompt_logprobs is None:
                # max_tokens 0 without prompt logprobs: nothing for the model to do.
                live.mark_started(time.perf_counter(), self._metrics)
                live.end(FinishReason.LENGTH, self._metrics)
            else:
                self._core.add(live)
        elif kind == "cancel":
            self._core.cancel(msg[1])
        elif kind in ("call", "chunk"):
            fn, fut = msg[1], msg[2]
            if fut.set_running_or_notify_cancel():
                try:
                    fut.set_result(fn())
                except BaseException as exc:
                    fut.set_exception(exc)

    def _teardown(self) -> None:
        try:
            self._core.shutdown()
        finally:
            # Requests posted after the stop message still get an answer.
            while True:
                try:
                    msg = self._inbox.get_nowait()
                except queue.Empty:
                    break
                if msg[0] == "add":
                    msg[1].sink.push((), None, EngineClosed("the engine shut down before the request ran"))
                elif msg[0] == "call":
                    msg[2].set_exception(EngineClosed("the engine shut down"))
            if self._owns_backend:
                self._backend.close()


class _Tracked(Sink):
    """Wraps a caller's sink to keep the engine's admission counters right."""

    def __init__(self, inner: Sink, engine: ServingEngine, request_id: str, prompt: tuple[int, ...],
                 adapter: str | None, tenant: str | None):
        self.inner = inner
        self.engine = engine
        self.request_id = request_id
        self.prompt = prompt
        self.adapter = adapter
        self.tenant = tenant
        self._queued = True

    def left_queue(self) -> None:
        if self._queued:
            self._queued = False
            self.engine._left_queue()

    def push(self, outputs, result=None, error=None) -> None:
        if result is not None or error is not None:
            self.left_queue()
            self.engine._released(self.request_id)
        if result is not None:
            # Before the caller sees the result, so feedback sent right after it finds the trajectory.
            self.engine._finished(self.request_id, self.prompt, self.adapter, result, self.tenant)
        self.inner.push(outputs, result, error)
