"""The OpenAI-compatible HTTP API over one :class:`ruvllm.serving.AsyncEngine` or a pool of them.

Routes only: each handler parses its body, asks the module that owns the work, and formats.
OpenAI JSON -> prompt ids and GenerationParams is ``params``; a completion's lifecycle (submit
every choice, cancel on refusal or disconnect, stream in batches) is
:mod:`~ruvllm.server.lifecycle.completion_service`; engine outputs -> OpenAI JSON are the formatters
(``responses``, ``tool_responses``, ``echo``), sent whole or streamed by ``delivery``.

Which engine serves a request (and with which LoRA adapter) is decided in one place, the
:class:`~ruvllm.server.lifecycle.model_pool.ModelPool`, from the request's ``model``; a single engine is a
pool of one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ruvllm.feedback import send_feedback
from ruvllm.guided.tools import plan_tools
from ruvllm.hardware import cpu_info
from ruvllm.server.anthropic.message_batches_api import register_message_batch_routes
from ruvllm.server.anthropic.messages_api import register_messages_routes
from ruvllm.server.batches.batches_api import register_batch_routes
from ruvllm.server.extensions.feedback import register_feedback
from ruvllm.server.extensions.lora import register_lora_routes
from ruvllm.server.extensions.metrics import CONTENT_TYPE, ServerMetrics
from ruvllm.server.extensions.tokenizer_info import QUERY_PARAMETERS, tokenizer_info
from ruvllm.server.http.errors import install_error_handlers
from ruvllm.server.http.field_names import FieldNames
from ruvllm.server.http.json_bodies import JsonBodiesMiddleware
from ruvllm.server.http.limits import RequestLimitsMiddleware, authorized
from ruvllm.server.http.path_aliases import PathAliasesMiddleware
from ruvllm.server.http.strict_fields import refuse_unknown_query
from ruvllm.server.lifecycle.batch_lane import BatchLane
from ruvllm.server.lifecycle.chat_run import start_chat
from ruvllm.server.lifecycle.completion_run import start_completion
from ruvllm.server.lifecycle.embeddings import (
    EmbeddingRequest,
    check_dimensions,
    embedding_limit,
    embeddings_response,
    input_ids,
    require_embeddings,
    split_inputs,
)
from ruvllm.server.lifecycle.model_pool import ModelEntry, ModelPool
from ruvllm.server.lifecycle.params import (
    Limits,
    chat_prompt_ids,
    completion_prompts,
    truncated,
)
from ruvllm.server.lifecycle.scheduling import priority_scheduling
from ruvllm.server.lifecycle.schemas import (
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from ruvllm.server.llama_server.llama_server_api import register_llama_server_routes
from ruvllm.server.llama_server.llama_server_info import register_llama_server_info_routes
from ruvllm.server.ollama.ollama_api import register_ollama_routes
from ruvllm.server.openai.chat_store import (
    ChatCompletionStore,
    refuse_storing_nowhere,
    register_chat_store_routes,
)
from ruvllm.server.openai.conversations_api import ConversationStore, register_conversation_routes
from ruvllm.server.openai.delivery import answer
from ruvllm.server.openai.echo import completion_formatter
from ruvllm.server.openai.response_store import ResponseStore
from ruvllm.server.openai.responses_api import register_responses_routes
from ruvllm.server.openapi import install_openapi_limits
from ruvllm.server.scoring.cohere_embed import register_cohere_embed_routes
from ruvllm.server.scoring.scoring import register_scoring_routes
from ruvllm.server.ui.page import ChatPageMiddleware
from ruvllm.serving import AsyncEngine
from ruvllm.tokenizer import require_encodable, require_in_vocabulary, token_piece


@attrs.frozen(kw_only=True)
class ServerSettings:
    #: The id clients pass as ``model`` (and see in ``/v1/models``).
    model_name: str
    #: Other names accepted for the same model (the reference the user typed, ``default``).
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_body_bytes: int = 1 << 20
    #: The body limit of a batch's input (``POST /v1/files``, ``POST /v1/messages/batches``).
    max_file_bytes: int = 200 << 20
    #: Requests one engine runs at once (its ``max_num_seqs``): llama-server's ``total_slots``;
    #: batches (``/v1/batches``, ``/v1/messages/batches``) together take half, interactive
    #: requests keep the rest.
    max_num_seqs: int = 16
    #: Responses the Responses API keeps, newest first (0: none).
    stored_responses: int = 1000
    #: Conversations the Conversations API keeps, newest first (0: none).
    stored_conversations: int = 1000
    #: Chat completions sent with ``store: true`` kept, newest first (0: none).
    stored_chat_completions: int = 1000
    limits: Limits = attrs.field(factory=Limits)
    #: LoRA adapters loaded at start on the single engine: name -> PEFT directory.
    lora_adapters: dict[str, str] = attrs.field(factory=dict)
    #: ``POST /v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` answer (else 403).
    allow_runtime_lora: bool = False
    #: Loads the single engine again after a request's ``keep_alive`` unloaded it (Ollama's API);
    #: None: it is never unloaded (e.g. a Ray replica set, which is not this process's to reload).
    reload: Callable[[], AsyncEngine] | None = None
    #: The chat page at ``/`` (for a browser) and ``/ui`` (``--no-ui``: off).
    ui: bool = True


#: Chat's refusals in its own body's names: the prompt a chat request is rendered into is its
#: ``messages`` (a context overflow names the prompt), as the other surfaces' tables say too.
_CHAT_NAMES = FieldNames.of({"prompt": "messages"})


def create_app(engine: AsyncEngine | ModelPool, settings: ServerSettings) -> FastAPI:
    """The FastAPI app; it owns ``engine`` (or every engine of the pool) and shuts it down when the
    server stops. With a pool, ``settings.model_name`` names its first model."""
    pool = engine if isinstance(engine, ModelPool) else ModelPool.single(
        engine, settings.model_name, settings.aliases, adapters=settings.lora_adapters,
        reload=settings.reload)
    single = None if isinstance(engine, ModelPool) else engine

    def single_feedback(request_id: str, score: float) -> None:
        """To the engine loaded now (a reload makes a new one; an unloaded model's old engine
        still says its requests are gone)."""
        assert single is not None
        (pool.default.engine or single).feedback(request_id, score)

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
            await batches.close()
            await message_batches.close()
            await stored_responses.close()
            await pool.shutdown()

    app = FastAPI(title="ruvllm", description="OpenAI-compatible API served by ruvllm",
                  lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.metrics = server_metrics
    app.add_middleware(RequestLimitsMiddleware, max_body_bytes=settings.max_body_bytes,
                       max_file_bytes=settings.max_file_bytes, api_key=settings.api_key)
    if settings.ui:  # outside the key check: the page's files are public, its data is not
        app.add_middleware(ChatPageMiddleware)
    app.add_middleware(JsonBodiesMiddleware)
    app.add_middleware(PathAliasesMiddleware)  # added last: outermost, so every layer sees the route
    install_error_handlers(app)
    # POST /v1/feedback (SONA): request ids are unique in the process, so one hook relay serves
    # every model (a pool's engines share the plugin registry's).
    register_feedback(app, single_feedback if single is not None else send_feedback)
    register_lora_routes(app, pool, allow_runtime=settings.allow_runtime_lora)
    register_ollama_routes(app, pool, settings.limits)
    register_messages_routes(app, pool, settings.limits)
    stored_responses = ResponseStore(settings.stored_responses)
    conversations = ConversationStore(settings.stored_conversations)
    register_responses_routes(app, pool, settings.limits, stored_responses, conversations)
    register_conversation_routes(app, conversations)
    chat_store = ChatCompletionStore(settings.stored_chat_completions)
    register_chat_store_routes(app, chat_store)
    register_llama_server_routes(app, pool, settings.limits)
    register_llama_server_info_routes(app, pool, settings.limits, total_slots=settings.max_num_seqs)
    register_scoring_routes(app, pool)
    register_cohere_embed_routes(app, pool)
    lane = BatchLane(app, api_key=settings.api_key, window=max(1, settings.max_num_seqs // 2))
    batches = register_batch_routes(app, lane)
    message_batches = register_message_batch_routes(app, lane)
    install_openapi_limits(
        app, settings.limits, single.info.vocab_size if single is not None else None,
        # Adapters loaded at runtime are valid names the published schema cannot know in advance.
        models=None if settings.allow_runtime_lora else pool.accepted_names(),
        priority_scheduling=priority_scheduling(single) if single is not None else True)

    def max_request_tokens(e: AsyncEngine) -> int:
        """Prompt + completion tokens one request may use on ``e``: the engine's context, capped
        by this server's ``--max-context``."""
        return settings.limits.context_length(e.info.context_length)


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
                "backend_choice": first.backend_choice if first is not None else None,
                "engine_path": first.path if first is not None else None,
                "models": models, "machine": cpu_info().as_dict()}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        cards = pool.cards()
        # OpenAI's list, and Anthropic's page (every model on it).
        return {"object": "list", "data": cards, "has_more": False,
                "first_id": cards[0]["id"] if cards else None, "last_id": cards[-1]["id"] if cards else None}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        return pool.card(model_id)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server_metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/tokenizer_info")  # vLLM's; lm-eval's remote tokenizer
    async def get_tokenizer_info(request: Request, model: str | None = None) -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), QUERY_PARAMETERS, "/tokenizer_info")
        async with pool.route(model) as route:
            return tokenizer_info(route.engine)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        async with pool.route(body.model) as route:
            engine = route.engine
            require_embeddings(route, body.model, "/v1/embeddings")
            check_dimensions(body.dimensions)
            most = embedding_limit(engine)
            ids = [truncated(x, body.truncate_prompt_tokens, body.truncation_side, most)
                   for x in await input_ids(engine, split_inputs(body.input))]
            vectors = await engine.embed_async(ids)
        return embeddings_response(vectors, model=route.served_name, encoding_format=body.encoding_format,
                                   prompt_tokens=sum(len(x) for x in ids))

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        async with pool.route(body.model) as route:
            return await _tokenize(body, route.engine)

    async def _tokenize(body: TokenizeRequest, engine: AsyncEngine) -> dict[str, Any]:
        if body.messages is not None:
            tools = plan_tools(body.tools, None, None, engine.info.chat_template)
            ids = await chat_prompt_ids(engine, body.messages, tools, body.template_options())
        else:
            field, add, parse = ("prompt", body.add_special_tokens, False) if body.content is None \
                else ("content", body.add_special, body.parse_special)
            text = require_encodable(field, body.prompt if body.content is None else body.content)
            # The engine refuses an empty prompt; "" is still a fair question here (the BOS alone),
            # and costs the event loop nothing to answer.
            ids = await engine.encode_async(text, add_special=add, parse_special=parse) if text \
                else engine.tokenizer.encode(text, add_special=add)
        tokens: list[Any] = [{"id": t, "piece": token_piece(engine.tokenizer, t)} for t in ids] \
            if body.with_pieces else ids
        return {"tokens": tokens, "count": len(ids), "max_model_len": engine.info.context_length}

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        async with pool.route(body.model) as route:
            engine = route.engine
        require_in_vocabulary("tokens", body.tokens, engine.tokenizer.vocab_size)
        text = engine.tokenizer.decode(body.tokens, skip_special=False)
        return {"prompt": text, "content": text}  # vLLM's name, and llama-server's

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        refuse_storing_nowhere(body, chat_store)
        async with pool.route(body.model) as route:
            with _CHAT_NAMES.speaking():
                run = await start_chat(route, body, settings.limits, id_prefix="chatcmpl")
            keep = functools.partial(chat_store.keep, body) if body.store else None
            return await answer(run.submission, run.formatter, request, body, [len(run.prompt_ids)],
                                on_answer=keep)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        async with pool.route(body.model) as route:
            engine = route.engine
            prompts = [truncated(ids, body.truncate_prompt_tokens, body.truncation_side,
                                 engine.info.context_length)
                       for ids in await completion_prompts(engine, body.prompt, body.suffix)]
            run = await start_completion(route, body, prompts, settings.limits, id_prefix="cmpl")
            echoes = [engine.tokenizer.decode(ids) for ids in prompts] if body.echo else None
            echo = {i: echoes[p] for i, p in enumerate(run.prompt_of)} if echoes is not None else None
            of_choice = run.choice_prompts()
            fmt = completion_formatter(run.submission.id, route.served_name, engine.tokenizer,
                                       run.choices[0].params.logprobs, echo=echo, prompts=of_choice,
                                       stream=body.stream)
            fmt.answer_as_asked(body, of_choice)
            return await answer(run.submission, fmt, request, body, [len(ids) for ids in prompts])

    return app
