"""``/tokenize``, ``/detokenize`` and ``/tokenizer_info``: the served model's tokenizer over HTTP.

vLLM's and llama-server's routes (one body serves both: ``prompt`` or ``content``, ``tokens``
back as ids or with their pieces); lm-evaluation-harness's remote tokenizer reads
``/tokenizer_info`` and tokenizes here, so scores are computed on the server's own token ids.
A conversation is tokenized as a chat request renders it (its template, its tools).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from pydantic import model_validator

from ruvllm.errors import InvalidRequest
from ruvllm.guided.tools import plan_tools
from ruvllm.server.extensions.tokenizer_info import QUERY_PARAMETERS, tokenizer_info
from ruvllm.server.http.chat_messages import ChatMessage, ChatTemplateFields, message_dicts
from ruvllm.server.http.strict_fields import RequestBody, refuse_unknown_query
from ruvllm.server.lifecycle.model_pool import ModelPool
from ruvllm.server.lifecycle.params import chat_prompt_ids
from ruvllm.serving import AsyncEngine
from ruvllm.tokenizer import require_encodable, require_in_vocabulary, token_piece


class TokenizeRequest(RequestBody, ChatTemplateFields):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    #: With ``prompt``: add the model's BOS. With ``messages`` the chat template places the special
    #: tokens, so only false (vLLM's default for chat) is accepted.
    add_special_tokens: bool = True
    #: With ``messages``: the chat request's tools (under ``tool_choice`` auto), so that the count
    #: is that request's, tools and all (vLLM's).
    tools: list[dict[str, Any]] | None = None
    #: llama-server's request: ``content`` is the text, tokenized without the BOS and with special
    #: tokens written as text parsed unless ``add_special`` / ``parse_special`` say otherwise;
    #: ``with_pieces`` answers each token as ``{"id", "piece"}``.
    content: str | None = None
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False

    @model_validator(mode="after")
    def _special_tokens_with_messages(self) -> TokenizeRequest:
        given = [name for name in ("prompt", "content", "messages") if getattr(self, name) is not None]
        if len(given) != 1:
            raise InvalidRequest(given[1] if given else "prompt",
                                 "give exactly one of prompt (vLLM's), content (llama-server's) or messages")
        llama = sorted({"add_special", "parse_special"} & self.model_fields_set)
        if llama and self.content is None:
            raise InvalidRequest(llama[0], "goes with content (llama-server's request); with prompt send "
                                 "add_special_tokens")
        if self.content is not None and "add_special_tokens" in self.model_fields_set:
            raise InvalidRequest("add_special_tokens", "goes with prompt (vLLM's request); with content send "
                                 "add_special (llama-server's)")
        if self.messages is not None and self.add_special_tokens and \
                "add_special_tokens" in self.model_fields_set:
            raise InvalidRequest("add_special_tokens", "cannot be true with messages: the chat template "
                                 "places the special tokens; leave it out (or false) with messages")
        template_fields = sorted((ChatTemplateFields.model_fields.keys() | {"tools"}) & self.model_fields_set)
        if self.messages is None and template_fields:
            raise InvalidRequest(template_fields[0], "is for the chat template, which renders messages; "
                                 "a prompt is tokenized as is")
        return self


class DetokenizeRequest(RequestBody):
    model: str | None = None
    tokens: list[int]


async def _tokenize(body: TokenizeRequest, engine: AsyncEngine) -> dict[str, Any]:
    if body.messages is not None:
        tools = plan_tools(body.tools, None, None, engine.info.chat_template)
        ids = await chat_prompt_ids(engine, message_dicts(body.messages), tools, body.template_options())
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
