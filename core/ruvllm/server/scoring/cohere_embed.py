"""Cohere's embed API (``POST /v2/embed``, and ``/v1/embed``), so that Cohere's official client
embeds through ruvllm as it ranks (:mod:`ruvllm.server.scoring.scoring`).

The vectors are ``/v1/embeddings``' (mean-pooled, L2-normalised; docs/server.md, Embeddings),
answered in Cohere's ``embeddings_by_type`` shape: ``float``, ``base64`` (little-endian float32)
and the bit-packed ``binary`` / ``ubinary`` (a bit per dimension: 1 where the value is not
negative), as vLLM answers them. Cohere's ``int8`` / ``uint8`` are a quantization calibrated per
Cohere model, which a served model has none of, so they are refused by name, as are images and
``output_dimension`` (no Matryoshka training). ``truncate`` (``END`` by default, as Cohere's) cuts an
input longer than ``max_tokens`` or than the backend's embedding limit; ``NONE`` refuses it.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any, Literal

import numpy as np
from fastapi import FastAPI
from pydantic import Field, model_validator

from ruvllm.errors import InvalidRequest
from ruvllm.server.http.strict_fields import RequestBody, StrictModel
from ruvllm.server.lifecycle.embeddings import embed_texts, embedding_limit, require_embeddings
from ruvllm.server.lifecycle.model_pool import ModelPool
from ruvllm.server.lifecycle.params import truncated

#: Cohere's limit on the inputs of one call.
MAX_INPUTS = 96
#: Cohere's types ruvllm answers, and what the others would need.
EMBEDDING_TYPES = ("float", "base64", "binary", "ubinary")
_UNSERVED_TYPES = {"int8": "Cohere's int8 is a quantization calibrated per Cohere model",
                   "uint8": "Cohere's uint8 is a quantization calibrated per Cohere model"}


class TextPart(StrictModel):
    type: Literal["text"]
    text: str


class EmbedInput(StrictModel):
    """Cohere's mixed input of text and image parts: here one text part (images are refused)."""

    content: list[TextPart] = Field(min_length=1)


class CohereEmbedRequest(RequestBody):
    model: str | None = None
    #: Accepted, unused: a served model has no task prefixes; a text gives one vector.
    input_type: Literal["search_document", "search_query", "classification", "clustering"] | None = None
    texts: list[str] | None = Field(None, min_length=1, max_length=MAX_INPUTS)
    inputs: list[EmbedInput] | None = Field(None, min_length=1, max_length=MAX_INPUTS)
    #: Refused unless empty: ruvllm serves text models.
    images: list[str] | None = None
    max_tokens: int | None = Field(None, ge=1)
    #: Refused unless null: a shortened vector is an embedding only for Matryoshka-trained models.
    output_dimension: int | None = None
    #: Left out: ``float`` (v2 answers ``embeddings_by_type``, v1 a bare list of floats).
    embedding_types: list[str] | None = Field(None, min_length=1)
    truncate: Literal["NONE", "START", "END"] = "END"
    #: Accepted, unused: embeddings run between two generation steps, ahead of every queued
    #: generation (scoring.py says so too).
    priority: int = 0

    @model_validator(mode="after")
    def _served(self) -> CohereEmbedRequest:
        if (self.texts is None) == (self.inputs is None):
            raise InvalidRequest("texts", "send the texts to embed once, as texts (or as inputs)")
        if self.images:
            raise InvalidRequest("images", "are not served: ruvllm serves text models; send texts")
        if self.output_dimension is not None:
            raise InvalidRequest("output_dimension", "is not supported: this model is not "
                                 "Matryoshka-trained, so a shortened vector would not be a valid embedding; "
                                 "remove it", self.output_dimension)
        for i, part in enumerate(self.inputs or []):
            if len(part.content) > 1:
                raise InvalidRequest(f"inputs[{i}].content", "holds several parts; ruvllm embeds one text "
                                     "per input: send one text part (or the texts in texts)")
        for i, kind in enumerate(self.embedding_types or []):
            if kind in _UNSERVED_TYPES:
                raise InvalidRequest(f"embedding_types[{i}]", f"{kind!r} is not served: "
                                     f"{_UNSERVED_TYPES[kind]}, which a served model has none of; ask "
                                     "float, base64, binary or ubinary")
            if kind not in EMBEDDING_TYPES:
                raise InvalidRequest(f"embedding_types[{i}]", f"must be one of {', '.join(EMBEDDING_TYPES)}; "
                                     f"got {kind!r}")
        return self

    def named_texts(self) -> list[tuple[str, str]]:
        """(field, text) of each input, as the client sent it."""
        if self.texts is not None:
            return [(f"texts[{i}]", t) for i, t in enumerate(self.texts)]
        return [(f"inputs[{i}].content[0].text", x.content[0].text) for i, x in enumerate(self.inputs or [])]


def cut(ids: list[int], limit: int, truncate: str, field: str) -> list[int]:
    """``ids`` within ``limit`` tokens: the first (``END``) or last (``START``) ``limit``, or a
    refusal naming ``field`` (``NONE``)."""
    if truncate == "NONE" and len(ids) > limit:
        raise InvalidRequest(field, f"has {len(ids)} tokens, more than the {limit} embedded per input; "
                             "shorten it, or set truncate to END or START", len(ids))
    return truncated(ids, limit, "right" if truncate == "END" else "left", limit)


def packed_bits(vectors: np.ndarray, *, signed: bool) -> list[list[int]]:
    """A bit per dimension, 1 where the value is not negative, eight to a byte (first dimension
    in the high bit); ``signed``: each byte less 128, as Cohere's ``binary``."""
    if vectors.shape[1] % 8:
        raise InvalidRequest("embedding_types", f"binary types pack 8 dimensions to a byte; this model's "
                             f"{vectors.shape[1]} are not a multiple of 8; ask float or base64")
    packed = np.packbits(vectors >= 0, axis=1).astype(np.int16)
    return (packed - 128 if signed else packed).tolist()


def typed(vectors: np.ndarray, kinds: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kind in dict.fromkeys(kinds):
        if kind == "float":
            out[kind] = vectors.astype(np.float32).tolist()
        elif kind == "base64":
            out[kind] = [base64.b64encode(v.astype("<f4").tobytes()).decode("ascii") for v in vectors]
        else:
            out[kind] = packed_bits(vectors, signed=kind == "binary")
    return out


def register_cohere_embed_routes(app: FastAPI, pool: ModelPool) -> None:
    """``POST /v2/embed``, and v1's ``/v1/embed`` (a bare list of floats unless
    ``embedding_types`` is sent)."""

    async def vectors_of(body: CohereEmbedRequest, endpoint: str) -> tuple[np.ndarray, list[str], int]:
        named = body.named_texts()
        async with pool.route(body.model) as route:
            engine = route.engine
            require_embeddings(route, body.model, endpoint)
            most = embedding_limit(engine)
            limit = min(body.max_tokens or most, most)
            vectors, tokens = await embed_texts(engine, named,
                                                lambda field, ids: cut(ids, limit, body.truncate, field))
        return np.asarray(vectors, dtype=np.float32), [t for _, t in named], tokens

    def answer(texts: list[str], tokens: int, version: str, embeddings: Any,
               response_type: str) -> dict[str, Any]:
        return {"id": f"embd-{uuid.uuid4().hex}", "response_type": response_type, "embeddings": embeddings,
                "texts": texts, "meta": {"api_version": {"version": version},
                                         "billed_units": {"input_tokens": tokens}}}

    @app.post("/v2/embed")
    async def embed_v2(body: CohereEmbedRequest) -> dict[str, Any]:
        vectors, texts, tokens = await vectors_of(body, "/v2/embed")
        return answer(texts, tokens, "2", typed(vectors, body.embedding_types or ["float"]),
                      "embeddings_by_type")

    @app.post("/v1/embed")
    async def embed_v1(body: CohereEmbedRequest) -> dict[str, Any]:
        vectors, texts, tokens = await vectors_of(body, "/v1/embed")
        if body.embedding_types is None:
            return answer(texts, tokens, "1", vectors.tolist(), "embeddings_floats")
        return answer(texts, tokens, "1", typed(vectors, body.embedding_types), "embeddings_by_type")
