"""The OpenAI-compatible HTTP API over an :class:`ruvllm.serving.AsyncEngine`.

Handlers only translate: OpenAI JSON -> prompt ids and GenerationParams (``params``), engine
outputs -> OpenAI JSON (``responses``). Every choice of every request is its own engine request,
submitted before the first one is awaited so that the engine can batch them. Submission errors
(bad parameters, context too long, queue full) come back with their real status codes because
nothing is streamed before every choice has been accepted.
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

from ruvllm.errors import BackendError, ContextLengthExceeded, InvalidRequest, ModelNotFound, RuvllmError
from ruvllm.guided.request import chat_constraint, completion_constraint
from ruvllm.guided.request import processors as guided_processors
from ruvllm.hardware import cpu_info
from ruvllm.server import responses
from ruvllm.server.echo import merge_echo
from ruvllm.server.embeddings import register_embeddings
from ruvllm.server.errors import install_error_handlers, ruvllm_error_body
from ruvllm.server.feedback import register_feedback
from ruvllm.server.limits import RequestLimitsMiddleware
from ruvllm.server.metrics import CONTENT_TYPE, ServerMetrics
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
from ruvllm.server.tokenizer_info import register_tokenizer_info
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


@attrs.define
class _Choice:
    index: int
    handle: RequestHandle
    prompt_index: int
    finished: bool = False


#: One choice's streamed outputs and its result.
_Outcome = tuple[list[TokenOutput], GenerationResult]


def create_app(engine: AsyncEngine, settings: ServerSettings) -> FastAPI:
    """The FastAPI app; it owns ``engine`` and shuts it down when the server stops."""

    server_metrics = ServerMetrics(engine.metrics, model_name=settings.model_name, model=engine.info.name,
                                   backend=engine.backend_name)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # Multiprocess mode: keep this worker's metric files current even when it is not scraped.
        refresher = asyncio.ensure_future(server_metrics.refresh_periodically()) \
            if server_metrics.multiprocess else None
        yield
        if refresher is not None:
            refresher.cancel()
        await engine.shutdown()

    app = FastAPI(title="ruvllm", description="OpenAI-compatible API served by ruvllm",
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.metrics = server_metrics
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=settings.max_body_bytes,
                       api_key=settings.api_key)
    install_error_handlers(app)
    register_feedback(app, engine)  # POST /v1/feedback (SONA)
    register_tokenizer_info(app, engine)  # GET /tokenizer_info (vLLM's; lm-eval's remote tokenizer)
    install_openapi_limits(app, settings.limits, engine.info.vocab_size,
                           models=[settings.model_name, *settings.aliases],
                           priority_scheduling=priority_scheduling(engine))
    accepted = {settings.model_name, *settings.aliases}

    def check_model(name: str | None) -> None:
        if name is not None and name not in accepted:
            raise ModelNotFound(f"model {name!r} is not served here; this server serves "
                                f"{settings.model_name!r} (see GET /v1/models)")

    # POST /v1/embeddings
    register_embeddings(app, engine, model_name=settings.model_name, check_model=check_model)

    context_length = settings.limits.context_length(engine.info.context_length)
    limit_note = getattr(engine, "context_limit_note", "") if context_length == engine.info.context_length \
        else "this server's --max-context setting"

    def room_after(ids: Sequence[int]) -> int:
        return context_length - len(ids)

    def check_context(ids: Sequence[int], params: GenerationParams) -> None:
        if len(ids) + params.max_tokens > context_length:
            raise ContextLengthExceeded(len(ids), params.max_tokens, context_length, limit_note=limit_note)

    async def submit_all(jobs: list[tuple[int, int, list[int], GenerationParams]],
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
                        events.append(sse_event(fmt.finish(c.index, item.finish_reason.value)))
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
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": settings.model_name, "backend": engine.backend_name,
                "engine_path": engine.path, "machine": cpu_info().as_dict()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return responses.model_list(settings.model_name, engine)

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        check_model(model_id)
        return responses.model_card(settings.model_name, engine)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server_metrics.render(), media_type=CONTENT_TYPE)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        check_model(body.model)
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
        check_model(body.model)
        vocab = engine.tokenizer.vocab_size
        bad = next((t for t in body.tokens if not 0 <= t < vocab), None)
        if bad is not None:
            raise InvalidRequest("tokens", f"token id {bad} is outside the vocabulary [0, {vocab})", bad)
        return {"prompt": engine.tokenizer.decode(body.tokens, skip_special=False)}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body.model)
        constraint = chat_constraint(body, engine.info.chat_template)
        ids = await chat_prompt_ids(engine, body.messages, constraint.tools.rendered)
        params = generation_params(body, limits=settings.limits, room=room_after(ids),
                                   logprobs_supported=engine.capabilities.logprobs)
        check_context(ids, params)
        procs = await guided_processors(engine, constraint.spec, body.n)
        jobs = [(i, 0, ids, seeded(params, i)) for i in range(body.n)]
        choices = await submit_all(jobs, "chatcmpl", procs,
                                   scheduling=submit_options(body.priority, body.cache_salt, engine))
        from ruvllm.guided.openai_format import ToolChatFormatter  # it imports server.responses

        fmt = responses.ChatFormatter(choices[0].handle.request_id.rsplit("-", 1)[0],
                                      settings.model_name, engine.tokenizer, params.logprobs) \
            if not constraint.tools.parses_output else ToolChatFormatter(
                choices[0].handle.request_id.rsplit("-", 1)[0], settings.model_name, engine.tokenizer,
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
        check_model(body.model)
        prompts = await completion_prompts(engine, body.prompt)
        if body.echo and body.stream and (body.logprobs is not None or body.max_tokens == 0):
            raise InvalidRequest("echo", "echo with logprobs or max_tokens 0 is answered whole, not "
                                 "streamed (prompt logprobs exist only once the prompt has run); "
                                 "set stream to false")
        jobs = []
        params = None
        for p_index, ids in enumerate(prompts):
            params = generation_params(body, limits=settings.limits, room=room_after(ids),
                                       logprobs_supported=engine.capabilities.logprobs)
            check_context(ids, params)
            for j in range(body.n):
                jobs.append((p_index * body.n + j, p_index, ids, seeded(params, j)))
        spec = completion_constraint(body).spec
        choices = await submit_all(jobs, "cmpl", await guided_processors(engine, spec, len(jobs)),
                                   scheduling=submit_options(body.priority, body.cache_salt, engine))
        echoes = [engine.tokenizer.decode(ids) if body.echo else "" for ids in prompts]
        fmt = responses.CompletionFormatter(
            choices[0].handle.request_id.rsplit("-", 1)[0], settings.model_name, engine.tokenizer,
            params.logprobs if params else None,
            echo={c.index: echoes[c.prompt_index] for c in choices} if body.echo else {})
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
