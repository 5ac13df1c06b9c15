"""OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings`` routes.

Thin handlers, as every surface's are: parse the body, translate it into the lifecycle's neutral
request (:mod:`ruvllm.server.openai.translation`), start it on the lifecycle
(:func:`~ruvllm.server.lifecycle.chat_run.start_chat`,
:func:`~ruvllm.server.lifecycle.completion_run.start_completion`,
:func:`~ruvllm.server.lifecycle.embeddings.embed_inputs`), and render what comes back in OpenAI's
shapes (:mod:`ruvllm.server.openai.formatters`, :mod:`ruvllm.server.openai.embeddings`), whole or
streamed (:mod:`ruvllm.server.openai.delivery`). They live here, beside the Responses and Conversations
APIs, so that ``app.py`` only assembles the surfaces and none of them is the server's own.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import Response

from ruvllm.server.lifecycle.chat_run import start_chat
from ruvllm.server.lifecycle.completion_run import start_completion
from ruvllm.server.lifecycle.embeddings import (
    check_dimensions,
    embed_inputs,
    embedding_limit,
    require_embeddings,
    split_inputs,
)
from ruvllm.server.lifecycle.model_pool import ModelPool
from ruvllm.server.lifecycle.params import Limits, completion_prompts, truncated
from ruvllm.server.openai.chat_store import ChatCompletionStore, refuse_storing_nowhere
from ruvllm.server.openai.delivery import answer
from ruvllm.server.openai.echo import completion_formatter
from ruvllm.server.openai.embeddings import embeddings_response
from ruvllm.server.openai.formatters import ChatFormatter
from ruvllm.server.openai.schemas import ChatCompletionRequest, CompletionRequest, EmbeddingRequest
from ruvllm.server.openai.translation import COMPLETION_NAMES, chat_input, chat_names, completion_input


def register_completion_routes(app: FastAPI, pool: ModelPool, limits: Limits,
                               chat_store: ChatCompletionStore) -> None:
    """OpenAI's chat, text completion and embeddings routes on ``app``, over ``pool``'s models;
    a chat completion sent with ``store`` is kept in ``chat_store``."""

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        refuse_storing_nowhere(body, chat_store)
        names = chat_names(body)
        async with pool.route(body.model) as route:
            with names.speaking():
                run = await start_chat(route, chat_input(body), limits, id_prefix="chatcmpl")
            keep = functools.partial(chat_store.keep, body) if body.store else None
            fmt = ChatFormatter.of(run, route.served_name, legacy_functions=body.legacy_functions)
            fmt.answer_as_asked(body, dict.fromkeys(range(body.n), run.prompt_ids))
            return await answer(run.submission, fmt, request, body, [len(run.prompt_ids)], names,
                                on_answer=keep)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        async with pool.route(body.model) as route:
            engine = route.engine
            prompts = [truncated(ids, body.truncate_prompt_tokens, body.truncation_side,
                                 engine.info.context_length)
                       for ids in await completion_prompts(engine, body.prompt, body.suffix)]
            run = await start_completion(route, completion_input(body), prompts, limits, id_prefix="cmpl")
            echoes = [engine.tokenizer.decode(ids) for ids in prompts] if body.echo else None
            echo = {i: echoes[p] for i, p in enumerate(run.prompt_of)} if echoes is not None else None
            of_choice = run.choice_prompts()
            fmt = completion_formatter(run.submission.id, route.served_name, engine.tokenizer,
                                       run.choices[0].params.logprobs, echo=echo, prompts=of_choice,
                                       stream=body.stream)
            fmt.answer_as_asked(body, of_choice)
            return await answer(run.submission, fmt, request, body, [len(ids) for ids in prompts],
                                COMPLETION_NAMES)

    @app.post("/v1/embeddings")
    async def embeddings(body: EmbeddingRequest) -> dict[str, Any]:
        async with pool.route(body.model) as route:
            engine = route.engine
            require_embeddings(route, body.model, "/v1/embeddings")
            check_dimensions(body.dimensions)
            most = embedding_limit(engine)
            embedded = await embed_inputs(engine, split_inputs(body.input), cut=lambda ids: truncated(
                ids, body.truncate_prompt_tokens, body.truncation_side, most))
        return embeddings_response(embedded, model=route.served_name, encoding_format=body.encoding_format)
