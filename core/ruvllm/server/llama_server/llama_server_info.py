"""llama-server's other endpoints: ``GET /props``, ``GET /slots`` and the non-OpenAI embeddings.

Clients written for llama-server read ``/props`` to learn the context one request may use
(``default_generation_settings.n_ctx``), how many requests run at once (``total_slots``) and the
chat template; ``/embedding`` and ``/embeddings`` answer ``[{"index", "embedding": [[...]]}]``
with ``embd_normalize`` (llama.cpp's normalisations of a pooled vector). ``/slots`` is a 501
saying why: ruvllm runs no fixed slots (requests share one KV pool), and describing its running
requests as slots would invent a state that does not exist.
"""

from __future__ import annotations

from importlib.metadata import version
from typing import Any

import numpy as np
from fastapi import FastAPI, HTTPException, Request
from pydantic import Field, model_validator

from ruvllm.errors import InvalidRequest
from ruvllm.server.http.field_names import FieldNames
from ruvllm.server.http.strict_fields import RequestBody, refuse_unknown_query
from ruvllm.server.lifecycle.completion_service import CompletionService
from ruvllm.server.lifecycle.embeddings import embed_inputs, require_embeddings, split_inputs
from ruvllm.server.lifecycle.model_pool import ModelPool
from ruvllm.server.lifecycle.params import Limits, generation_params
from ruvllm.server.lifecycle.request_input import RequestInput
from ruvllm.server.llama_server.llama_server_api import generation_settings, llama_cpp_rules
from ruvllm.server.llama_server.llama_server_schemas import LlamaCompletionRequest, sampling

#: llama.cpp's max-absolute normalisation scales into int16's range.
_INT16_SCALE = 32760.0


class LlamaEmbeddingRequest(RequestBody):
    """``/embedding``'s body (llama-server's ``content``, or ``input`` as ``/v1/embeddings``)."""

    content: str | list[str] | list[int] | list[list[int]] | None = None
    input: str | list[str] | list[int] | list[list[int]] | None = None
    model: str | None = None
    #: -1 none, 0 max absolute (int16 range), 1 taxicab, 2 Euclidean (the default), >2 p-norm.
    embd_normalize: int = Field(2, ge=-1)

    @model_validator(mode="after")
    def _one_input(self) -> LlamaEmbeddingRequest:
        if (self.content is None) == (self.input is None):
            raise InvalidRequest("content", "send the text as content (or as input), once")
        return self


def normalized(vectors: np.ndarray, embd_normalize: int) -> np.ndarray:
    """``vectors`` (unit length, as the engine pools them) under llama.cpp's ``embd_normalize``:
    each of its normalisations only rescales a vector, so it can be applied to a unit one; -1
    (none) would need the length the engine does not keep and is refused."""
    if embd_normalize == -1:
        raise InvalidRequest("embd_normalize", "-1 (no normalisation) needs the pooled vector's own length, "
                             "and the engine returns unit vectors; use 2 (Euclidean, the default), 1, 0 or "
                             "a p-norm above 2", embd_normalize)
    if embd_normalize == 0:
        scale = np.abs(vectors).max(axis=1, keepdims=True) / _INT16_SCALE
    else:
        scale = (np.abs(vectors) ** embd_normalize).sum(axis=1, keepdims=True) ** (1.0 / embd_normalize)
    return vectors / np.where(scale == 0, 1.0, scale)


def register_llama_server_info_routes(app: FastAPI, pool: ModelPool, limits: Limits, *,
                                      total_slots: int) -> None:
    """``/props``, ``/slots``, ``/embedding`` and ``/embeddings``; ``total_slots``: requests one
    engine runs at once."""

    @app.get("/props")
    async def props(request: Request, model: str | None = None) -> dict[str, Any]:
        refuse_unknown_query(request.query_params.keys(), ("model",), "/props")
        async with pool.route(model) as route:
            engine = route.engine
            context = CompletionService(route, limits).context_length
            body = LlamaCompletionRequest(prompt="")
            # A request that sets nothing: core's defaults, with what fits after a one-token prompt.
            params = generation_params(RequestInput(sampling=sampling(body)), limits=limits,
                                       room=context - 1, logprobs_supported=engine.capabilities.logprobs)
            params = llama_cpp_rules(params, body, engine)
            info, name = engine.info, route.served_name
            settings = generation_settings(params, body, context=context, model=name)
            return {"default_generation_settings": {"n_ctx": context, "params": settings},
                    "total_slots": total_slots, "model_path": info.path or "", "model_alias": name,
                    "chat_template": info.chat_template or "", "chat_template_caps": {},
                    "modalities": {"vision": False, "audio": False},
                    "bos_token": info.special_tokens.bos_text, "eos_token": info.special_tokens.eos_text,
                    "build_info": f"ruvllm {version('ruvllm')}", "is_sleeping": False}

    @app.get("/slots")
    async def slots() -> None:
        raise HTTPException(501, "/slots is not served: ruvllm runs no fixed slots (requests share one KV "
                            "pool, docs/engine.md); GET /metrics reports the requests running and waiting, "
                            "GET /props total_slots how many run at once")

    @app.post("/embedding")
    @app.post("/embeddings")
    async def embedding(body: LlamaEmbeddingRequest) -> list[dict[str, Any]]:
        async with pool.route(body.model) as route:
            require_embeddings(route, body.model, "/embedding")
            # The lifecycle's refusals name ``input``; this client may have sent ``content``.
            with FieldNames.of({"input": "content"} if body.content is not None else {}).speaking():
                items = split_inputs(body.content if body.content is not None else body.input)
                embedded = await embed_inputs(route.engine, items)
        vectors = normalized(np.asarray(embedded.vectors, dtype=np.float64), body.embd_normalize)
        return [{"index": i, "embedding": [v.tolist()]} for i, v in enumerate(vectors)]
