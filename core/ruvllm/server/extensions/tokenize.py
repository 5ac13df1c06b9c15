"""``/tokenize``, ``/detokenize`` and ``/tokenizer_info``: the served model's tokenizer over HTTP.

vLLM's and llama-server's routes (one body serves both: ``prompt`` or ``content``, ``tokens``
back as ids or with their pieces); lm-evaluation-harness's remote tokenizer reads
``/tokenizer_info`` and tokenizes here, so scores are computed on the server's own token ids.
A conversation is tokenized as a chat request renders it (its template, its tools).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request

from ruvllm.guided.tools import plan_tools
from ruvllm.server.extensions.tokenizer_info import QUERY_PARAMETERS, tokenizer_info
from ruvllm.server.http.strict_fields import refuse_unknown_query
from ruvllm.server.lifecycle.model_pool import ModelPool
from ruvllm.server.lifecycle.params import chat_prompt_ids
from ruvllm.server.lifecycle.schemas import DetokenizeRequest, TokenizeRequest
from ruvllm.serving import AsyncEngine
from ruvllm.tokenizer import require_encodable, require_in_vocabulary, token_piece


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


def register_tokenize_routes(app: FastAPI, pool: ModelPool) -> None:
    """The tokenizer routes on ``app``, for ``pool``'s models."""

    @app.get("/tokenizer_info")  # vLLM's; lm-eval's remote tokenizer
    async def get_tokenizer_info(request: Request, model: str | None = None) -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), QUERY_PARAMETERS, "/tokenizer_info")
        async with pool.route(model) as route:
            return tokenizer_info(route.engine)

    @app.post("/tokenize")
    async def tokenize(body: TokenizeRequest) -> dict[str, Any]:
        async with pool.route(body.model) as route:
            return await _tokenize(body, route.engine)

    @app.post("/detokenize")
    async def detokenize(body: DetokenizeRequest) -> dict[str, Any]:
        async with pool.route(body.model) as route:
            engine = route.engine
        require_in_vocabulary("tokens", body.tokens, engine.tokenizer.vocab_size)
        text = engine.tokenizer.decode(body.tokens, skip_special=False)
        return {"prompt": text, "content": text}  # vLLM's name, and llama-server's
