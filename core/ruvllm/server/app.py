"""The OpenAI-compatible HTTP API over one :class:`ruvllm.serving.AsyncEngine` or a pool of them.

Handlers only translate: OpenAI JSON -> prompt ids and GenerationParams (``params``), engine
outputs -> OpenAI JSON (``responses``). Every choice of every request is its own engine request,
submitted before the first one is awaited so that the engine can batch them. Submission errors
(bad parameters, context too long, queue full) come back with their real status codes because
nothing is streamed before every choice has been accepted.

Which engine serves a request (and with which LoRA adapter) is decided in one place, the
:class:`~ruvllm.server.model_pool.ModelPool`, from the request's ``model``; a single engine is a
pool of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from ruvllm.errors import BackendError, ContextLengthExceeded, InvalidRequest, RuvllmError
from ruvllm.feedback import send_feedback
from ruvllm.guided.request import chat_constraint, completion_constraint
from ruvllm.guided.request import processors as guided_processors
from ruvllm.hardware import cpu_info
from ruvllm.server import responses
from ruvllm.server.echo import completion_formatter, finish_event, merge_echo
from ruvllm.server.embeddings import (
    EmbeddingRequest,
    check_dimensions,
    embeddings_response,
    input_ids,
    split_inputs,
)
from ruvllm.server.errors import install_error_handlers, ruvllm_error_body
from ruvllm.server.feedback import register_feedback
from ruvllm.server.limits import RequestLimitsMiddleware, authorized
from ruvllm.server.lora import register_lora_routes
from ruvllm.server.metrics import CONTENT_TYPE, ServerMetrics
from ruvllm.server.model_pool import ModelEntry, ModelPool, Route
from ruvllm.server.openapi import install_openapi_limits
from ruvllm.server.params import (
    Limits,
    chat_prompt_ids,
    completion_prompts,
    generation_params,
    seeded,
)
from ruvllm.server.scheduling import priority_scheduling, submit_options
from ruvllm.server.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from ruvllm.server.sse import DONE, SSEResponse, sse_event
from ruvllm.server.tokenizer_info import tokenizer_info
from ruvllm.server.tool_responses import ToolChatFormatter
from ruvllm.serving import AsyncEngine, RequestHandle
from ruvllm.tokenizer import require_encodable
from ruvllm.types import FinishReason, GenerationParams, GenerationResult, TokenOutput


@attrs.frozen(kw_only=True)
class ServerSettings:
    #: The id clients pass as ``model`` (and see in ``/v1/models``).
    model_name: str
    #: Other names accepted for the same model (the reference the user typed, ``default``).
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    limits: Limits = attrs.field(factory=Limits)
    #: LoRA adapters loaded at start on the single engine: name -> PEFT directory.
    lora_adapters: dict[str, str] = attrs.field(factory=dict)
    #: ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` answer (else 403).
    allow_runtime_lora: bool = False


@attrs.define
class _Choice:
    index: int
    handle: RequestHandle
    prompt_index: int
    finished: bool = False


#: One choice's streamed outputs and its result.
_Outcome = tuple[list[TokenOutput], GenerationResult]


@attrs.frozen
class _Target:
    """One request's engine, adapter and the name its responses carry, with the engine's limits."""

    engine: AsyncEngine
    adapter: str | None
    model_name: str
    context_length: int
    limit_note: str

    def room_after(self, ids: Sequence[int]) -> int:
        return self.context_length - len(ids)

    def check_context(self, ids: Sequence[int], params: GenerationParams) -> None:
        if len(ids) + params.max_tokens > self.context_length:
            raise ContextLengthExceeded(len(ids), params.max_tokens, self.context_length,
                                        limit_note=self.limit_note)

    def with_adapter(self, params: GenerationParams) -> GenerationParams:
        return params if self.adapter is None else attrs.evolve(params, adapter=self.adapter)


def create_app(engine: AsyncEngine | ModelPool, settings: ServerSettings) -> FastAPI:
    """The FastAPI app; it owns ``engine`` (or every engine of the pool) and shuts it down when the
    server stops. With a pool, ``settings.model_name`` names its first model."""
    pool = engine if isinstance(engine, ModelPool) else ModelPool.single(
        engine, settings.model_name, settings.aliases, adapters=settings.lora_adapters)
    single = None if isinstance(engine, ModelPool) else engine
    server_metrics = ServerMetrics()

    def metrics_attach(entry: ModelEntry) -> None:
        e = entry.engine
        assert e is not None
        server_metrics.attach(e.metrics, model_name=entry.name, model=e.info.name, backend=e.backend_name)

    pool.on_loaded.append(metrics_attach)
    pool.on_unloading.append(lambda entry: server_metrics.detach(entry.name))
    for entry in pool.entries.values():
        if entry.engine is not None:
            metrics_attach(entry)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # Multiprocess mode: keep this worker's metric files current even when it is not scraped.
        refresher = asyncio.ensure_future(server_metrics.refresh_periodically()) \
            if server_metrics.multiprocess else None
        try:
            await pool.start()
            yield
        finally:
            if refresher is not None:
                refresher.cancel()
            await pool.shutdown()

    app = FastAPI(title="ruvllm", description="OpenAI-compatible API served by ruvllm",
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.metrics = server_metrics
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=settings.max_body_bytes,
                       api_key=settings.api_key)
    install_error_handlers(app)
    # POST /v1/feedback (SONA): request ids are unique in the process, so one hook relay serves
    # every model (a pool's engines share the plugin registry's).
    register_feedback(app, single.feedback if single is not None else send_feedback)
    register_lora_routes(app, pool, allow_runtime=settings.allow_runtime_lora)
    install_openapi_limits(
        app, settings.limits, single.info.vocab_size if single is not None else None,
        # Adapters loaded at runtime are valid names the published schema cannot know in advance.
        models=None if settings.allow_runtime_lora else pool.accepted_names(),
        priority_scheduling=priority_scheduling(single) if single is not None else True)

    def max_request_tokens(e: AsyncEngine) -> int:
        """Prompt + completion tokens one request may use on ``e``: the engine's context, capped
        by this server's ``--max-context``."""
        return settings.limits.context_length(e.info.context_length)

    def target(route: Route) -> _Target:
        e = route.engine
        context_length = max_request_tokens(e)
        limit_note = e.context_limit_note if context_length == e.info.context_length \
            else "this server's --max-context setting"
        return _Target(e, route.adapter, route.served_name, context_length, limit_note)

    async def submit_all(engine: AsyncEngine, jobs: list[tuple[int, int, list[int], GenerationParams]],
                         kind: str, processors: Sequence[Sequence[Any]] = (), *,
                         scheduling: dict[str, Any] | None = None) -> list[_Choice]:
        """Submit every choice; if one is refused, cancel those already accepted.
        ``processors[k]`` are job k's logits processors (its grammar), when there are any."""
        base = f"{kind}-{uuid.uuid4().hex[:24]}"
        choices: list[_Choice] = []
        try:
            for k, (index, prompt_index, ids, params) in enumerate(jobs):
                extra = {"logits_processors": processors[k]} if processors and processors[k] else {}
                handle = await engine.submit(ids, params, request_id=f"{base}-{index}", **extra,
                                             **(scheduling or {}))
                choices.append(_Choice(index=index, handle=handle, prompt_index=prompt_index))
        except BaseException:
            for c in choices:
                c.handle.cancel()
            raise
        return choices

    async def collect(choice: _Choice) -> tuple[list[TokenOutput], GenerationResult]:
        outputs = [out async for out in choice.handle]
        result = await choice.handle.result()
        choice.finished = True
        if result.finish_reason is FinishReason.ERROR:
            raise BackendError(f"request {choice.handle.request_id} failed in the engine")
        return outputs, result

    async def gather_watching(request: Request, choices: list[_Choice]) -> list[_Outcome] | None:
        """All choices' outputs, or None when the client went away first (every request is then
        cancelled)."""
        work = asyncio.ensure_future(asyncio.gather(*(collect(c) for c in choices)))

        async def client_gone() -> None:
            while not await request.is_disconnected():
                await asyncio.sleep(0.25)

        watcher = asyncio.ensure_future(client_gone())
        try:
            done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            return work.result() if work in done else None
        finally:
            watcher.cancel()
            if not work.done():
                work.cancel()
            # Retrieve the outcome so a cancelled gather is not reported as "never retrieved".
            work.add_done_callback(lambda f: f.cancelled() or f.exception())
            for c in choices:
                if not c.finished:
                    c.handle.cancel()

    async def arrivals(choices: list[_Choice]) -> AsyncIterator[list[tuple[_Choice, object]]]:
        """Batches of ``(choice, TokenOutput | GenerationResult | Exception)``, as they arrive.

        One choice is read straight from its handle. Several are pumped into one queue by a task
        each; a batch is everything the queue holds when the consumer looks, so the outputs one
        engine step produced for all choices leave in one write.
        """
        if len(choices) == 1:
            c = choices[0]
            try:
                async for out in c.handle:
                    yield [(c, out)]
                yield [(c, await c.handle.result())]
            except Exception as exc:  # reported in the stream by the consumer
                yield [(c, exc)]
            return
        queue: asyncio.Queue = asyncio.Queue()

        async def pump(c: _Choice) -> None:
            try:
                async for out in c.handle:
                    queue.put_nowait((c, out))
                queue.put_nowait((c, await c.handle.result()))
            except Exception as exc:
                queue.put_nowait((c, exc))

        tasks = [asyncio.ensure_future(pump(c)) for c in choices]
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                yield batch
        finally:
            for t in tasks:
                t.cancel()

    async def stream_events(choices: list[_Choice], fmt: responses.ChunkFormatter,
                            include_usage: bool, prompt_tokens: int) -> AsyncIterator[str]:
        """The SSE body: one OpenAI chunk per token; chunks ready at the same time share one write."""
        events = [sse_event(first) for first in (fmt.opening(c.index) for c in choices) if first is not None]
        remaining, completion_tokens, failed = len(choices), 0, False
        source = arrivals(choices)
        try:
            if events:  # the role / echo chunks go out at once, before the first token
                yield "".join(events)
                events.clear()
            async for batch in source:
                for c, item in batch:
                    if isinstance(item, TokenOutput):
                        event = fmt.token_event(c.index, item)
                        if event is not None:
                            events.append(event)
                        continue
                    c.finished = True
                    remaining -= 1
                    if isinstance(item, GenerationResult) and item.finish_reason is not FinishReason.ERROR:
                        completion_tokens += item.usage.completion_tokens
                        events.append(finish_event(fmt, c.index, item))
                        continue
                    exc = item if isinstance(item, RuvllmError) else BackendError(
                        f"request {c.handle.request_id} failed: {item}")
                    events.append(sse_event(ruvllm_error_body(exc)[1]))
                    failed = True
                    break
                if failed or not remaining:
                    break
                if events:
                    yield "".join(events)
                    events.clear()
            if not failed and include_usage:
                events.append(sse_event(fmt.usage(prompt_tokens, completion_tokens)))
            events.append(DONE)
            yield "".join(events)
        finally:
            await source.aclose()
            for c in choices:
                if not c.finished:
                    c.handle.cancel()

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        """Liveness for anyone: ``{"status": "ok"}``. With the API key (or on a server without
        one) also the details: the first model, backend, engine path, each model's state and
        ``max_request_tokens``, and the machine. Probes need no key, but an unauthenticated client
        learns nothing about the models or the machine (limits.py's promise)."""
        if not authorized(dict(request.scope.get("headers") or ()), settings.api_key):
            return {"status": "ok"}
        first = pool.default.engine
        models: dict[str, dict[str, Any]] = {}
        for e in pool.entries.values():
            models[e.name] = {"state": e.state.value}
            if e.engine is not None:
                models[e.name]["max_request_tokens"] = max_request_tokens(e.engine)
        return {"status": "ok", "model": pool.default.name,
                "backend": first.backend_name if first is not None else None,
                "engine_path": first.path if first is not None else None,
                "models": models, "machine": cpu_info().as_dict()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": pool.cards()}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        return pool.card(model_id)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server_metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/tokenizer_info")  # vLLM's; lm-eval's remote tokenizer
    async def get_tokenizer_info(model: str | None = None) -> dict[str, Any]:
        async with pool.route(model) as route:
            return tokenizer_info(route.engine)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        async with pool.route(body.model) as route:
            engine = route.engine
            if not engine.capabilities.embeddings:
                raise InvalidRequest("model", f"{route.entry!r} is served by backend "
                                     f"{engine.backend_name!r}, which cannot produce embeddings; serve it "
                                     "with --backend candle_like or llamacpp for /v1/embeddings", body.model)
            check_dimensions(body.dimensions)
            ids = await input_ids(engine, split_inputs(body.input))
            vectors = await engine.embed_async(ids)
        return embeddings_response(vectors, model=route.served_name, encoding_format=body.encoding_format,
                                   prompt_tokens=sum(len(x) for x in ids))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        async with pool.route(body.model) as route:
            return await _tokenize(body, route.engine)

    async def _tokenize(body: TokenizeRequest, engine: AsyncEngine) -> dict[str, Any]:
        if (body.prompt is None) == (body.messages is None):
            raise InvalidRequest("prompt", "give exactly one of prompt or messages")
        if body.messages is not None:
            ids = await chat_prompt_ids(engine, body.messages)
        else:
            text = require_encodable("prompt", body.prompt or "")
            # The engine refuses an empty prompt; "" is still a fair question here (the BOS alone),
            # and costs the event loop nothing to answer.
            ids = await engine.encode_async(text, add_special=body.add_special_tokens) if text \
                else engine.tokenizer.encode(text, add_special=body.add_special_tokens)
        return {"tokens": ids, "count": len(ids), "max_model_len": engine.info.context_length}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        async with pool.route(body.model) as route:
            engine = route.engine
        vocab = engine.tokenizer.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequest("tokens", f"token id {bad} is outside the vocabulary [0, {vocab})", bad)
        return {"prompt": engine.tokenizer.decode(body.tokens, skip_special=False)}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        async with pool.route(body.model) as route:
            return await _chat_completions(body, request, target(route))

    async def _chat_completions(body: ChatCompletionRequest, request: Request, served: _Target) -> Response:
        engine = served.engine
        constraint = chat_constraint(body, engine.info.chat_template)
        ids = await chat_prompt_ids(engine, body.messages, constraint.tools.rendered)
        params = served.with_adapter(generation_params(body, limits=settings.limits,
                                                       room=served.room_after(ids),
                                                       logprobs_supported=engine.capabilities.logprobs))
        served.check_context(ids, params)
        procs = await guided_processors(engine, constraint.spec, body.n)
        jobs = [(i, 0, ids, seeded(params, i)) for i in range(body.n)]
        choices = await submit_all(engine, jobs, "chatcmpl", procs,
                                   scheduling=submit_options(body.priority, body.cache_salt, engine))
        fmt = responses.ChatFormatter(choices[0].handle.request_id.rsplit("-", 1)[0],
                                      served.model_name, engine.tokenizer, params.logprobs) \
            if not constraint.tools.parses_output else ToolChatFormatter(
                choices[0].handle.request_id.rsplit("-", 1)[0], served.model_name, engine.tokenizer,
                params.logprobs, plan=constraint.tools)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return SSEResponse(stream_events(choices, fmt, include_usage, len(ids)))
        outcomes = await gather_watching(request, choices)
        if outcomes is None:
            return Response(status_code=499)  # the client is gone
        return JSONResponse(fmt.complete(outcomes, [len(ids)]))

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        async with pool.route(body.model) as route:
            return await _completions(body, request, target(route))

    async def _completions(body: CompletionRequest, request: Request, served: _Target) -> Response:
        engine = served.engine
        prompts = await completion_prompts(engine, body.prompt)
        jobs = []
        params = None
        for p_index, ids in enumerate(prompts):
            params = served.with_adapter(generation_params(body, limits=settings.limits,
                                                           room=served.room_after(ids),
                                                           logprobs_supported=engine.capabilities.logprobs))
            served.check_context(ids, params)
            for j in range(body.n):
                jobs.append((p_index * body.n + j, p_index, ids, seeded(params, j)))
        spec = completion_constraint(body).spec
        choices = await submit_all(engine, jobs, "cmpl", await guided_processors(engine, spec, len(jobs)),
                                   scheduling=submit_options(body.priority, body.cache_salt, engine))
        echoes = [engine.tokenizer.decode(ids) if body.echo else "" for ids in prompts]
        fmt = completion_formatter(
            choices[0].handle.request_id.rsplit("-", 1)[0], served.model_name, engine.tokenizer,
            params.logprobs if params else None, stream=body.stream, echo_only=body.max_tokens == 0,
            echo={c.index: echoes[c.prompt_index] for c in choices} if body.echo else {},
            prompts={c.index: prompts[c.prompt_index] for c in choices})
        prompt_tokens = sum(len(ids) for ids in prompts)
        if body.stream:
            include_usage = bool(body.stream_options and body.stream_options.include_usage)
            return SSEResponse(stream_events(choices, fmt, include_usage, prompt_tokens))
        outcomes = await gather_watching(request, choices)
        if outcomes is None:
            return Response(status_code=499)  # the client is gone
        answer = fmt.complete(outcomes, [len(ids) for ids in prompts])
        if body.echo:
            answer = merge_echo(answer, [r for _, r in outcomes], [prompts[c.prompt_index] for c in choices],
                                [echoes[c.prompt_index] for c in choices], engine.tokenizer,
                                top_n=body.logprobs, echo_only=body.max_tokens == 0)
        return JSONResponse(answer)

    return app
