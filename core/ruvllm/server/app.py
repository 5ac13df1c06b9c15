"""The server's assembly: one FastAPI app over one :class:`ruvllm.serving.AsyncEngine` or a pool of them.

``create_app`` adds the middleware and error handlers and registers each API surface's routes
(``openai/``, ``anthropic/``, ``ollama/``, ``llama_server/``, ``batches/``, ``scoring/``,
``extensions/``); the handlers live in their surfaces, over the lifecycle they share. What is
left here is the server's own: ``/health``, ``/v1/models`` (OpenAI's list and Anthropic's page
alike) and ``/metrics``.

Which engine serves a request (and with which LoRA adapter) is decided in one place, the
:class:`~ruvllm.server.lifecycle.model_pool.ModelPool`, from the request's ``model``; a single engine is a
pool of one.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import attrs
from fastapi import FastAPI, Request
from fastapi.responses import Response

from ruvllm.feedback import send_feedback
from ruvllm.hardware import cpu_info
from ruvllm.server.anthropic.message_batches_api import register_message_batch_routes
from ruvllm.server.anthropic.messages_api import register_messages_routes
from ruvllm.server.batches.batches_api import register_batch_routes
from ruvllm.server.extensions.feedback import register_feedback
from ruvllm.server.extensions.lora import register_lora_routes
from ruvllm.server.extensions.metrics import CONTENT_TYPE, ServerMetrics
from ruvllm.server.extensions.tokenize import register_tokenize_routes
from ruvllm.server.http.errors import install_error_handlers
from ruvllm.server.http.json_bodies import JsonBodiesMiddleware
from ruvllm.server.http.limits import RequestLimitsMiddleware, authorized
from ruvllm.server.http.path_aliases import PathAliasesMiddleware
from ruvllm.server.lifecycle.batch_lane import BatchLane
from ruvllm.server.lifecycle.model_pool import ModelEntry, ModelPool, ServedModel
from ruvllm.server.lifecycle.params import Limits
from ruvllm.server.lifecycle.scheduling import priority_scheduling
from ruvllm.server.llama_server.llama_server_api import register_llama_server_routes
from ruvllm.server.llama_server.llama_server_info import register_llama_server_info_routes
from ruvllm.server.ollama.ollama_api import register_ollama_routes
from ruvllm.server.openai.chat_store import ChatCompletionStore, register_chat_store_routes
from ruvllm.server.openai.completions_api import register_completion_routes
from ruvllm.server.openai.conversations_api import ConversationStore, register_conversation_routes
from ruvllm.server.openai.response_store import ResponseStore
from ruvllm.server.openai.responses_api import register_responses_routes
from ruvllm.server.openapi import install_openapi_limits
from ruvllm.server.scoring.cohere_embed import register_cohere_embed_routes
from ruvllm.server.scoring.scoring import register_scoring_routes
from ruvllm.server.ui.page import ChatPageMiddleware
from ruvllm.serving import AsyncEngine


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


def model_card(served: ServedModel) -> dict[str, Any]:
    """A ``/v1/models`` entry, which OpenAI's and Anthropic's SDKs both list from: OpenAI's
    ``model`` (``object``, ``created``, ``owned_by``) and Anthropic's (``type``, ``display_name``,
    ``created_at``, ``max_input_tokens``) in one object (``created`` 0: ruvllm knows no model's
    release date), with vLLM's ``root``, ``parent`` and ``max_model_len`` and ruvllm's state."""
    card: dict[str, Any] = {
        "id": served.name, "object": "model", "created": 0, "owned_by": "ruvllm", "type": "model",
        "display_name": served.name, "created_at": "1970-01-01T00:00:00Z", "lifecycle": "active",
        "root": served.root, "parent": served.parent, "state": served.state.value}
    if served.context_length is not None:
        card.update(max_model_len=served.context_length, max_input_tokens=served.context_length,
                    backend=served.backend, tool_format=served.tool_format)
    if served.error is not None:
        card["error"] = served.error
    return card


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
    register_completion_routes(app, pool, settings.limits, chat_store)
    register_tokenize_routes(app, pool)
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
        cards = [model_card(m) for m in pool.served()]
        # OpenAI's list, and Anthropic's page (every model on it).
        return {"object": "list", "data": cards, "has_more": False,
                "first_id": cards[0]["id"] if cards else None, "last_id": cards[-1]["id"] if cards else None}

    @app.get("/v1/models/{model_id:path}")
    async def model(model_id: str) -> dict[str, Any]:
        return model_card(pool.served_one(model_id))

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(server_metrics.render(), media_type=CONTENT_TYPE)

    return app
