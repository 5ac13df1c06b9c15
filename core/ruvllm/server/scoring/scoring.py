"""Relevance scores: vLLM's ``/score``, the rerank endpoints RAG clients call, and TEI's rerank.

Retrieval pipelines (LangChain's and LlamaIndex's rerankers, Open WebUI's external reranker,
Cohere's and Jina's clients, llama.vim's neighbours) ask a server to rank documents against a
query. Their endpoints differ in path and wrapping only: vLLM's ``/rerank`` (Jina's shape, also
``/v1/rerank`` and Cohere's ``/v2/rerank``), llama-server's ``/reranking`` (``/v1/reranking``)
and Hugging Face TEI's ``/rerank`` body (``texts``, answered as a bare list). One body serves
them all, and ``/score`` (``/v1/score``) scores text pairs as vLLM does.

A score is the cosine similarity of the model's embeddings of the two texts (the mean-pooled,
L2-normalised vectors of ``/v1/embeddings``): what vLLM's score and rerank endpoints compute for
a model that is not a cross-encoder, and the served models are decoders. It is a similarity in
[-1, 1], not a calibrated probability. Every distinct text is embedded once, in one batch on the
engine's model thread (``AsyncEngine.embed_async``), so a query is not recomputed per document.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any

import numpy as np
from fastapi import FastAPI
from pydantic import Discriminator, Field, Tag, model_validator

from ruvllm.errors import InvalidRequest
from ruvllm.server.http.strict_fields import RequestBody, StrictModel
from ruvllm.server.lifecycle.embeddings import MAX_INPUTS, embed_texts, require_embeddings
from ruvllm.server.lifecycle.model_pool import ModelPool
from ruvllm.serving import AsyncEngine

_Texts = str | list[str]
#: vLLM's score bodies name the two sides of each pair in one of these ways.
SCORE_PAIRS = (("text_1", "text_2"), ("queries", "documents"), ("queries", "items"), ("data_1", "data_2"))
_SIDES = tuple(dict.fromkeys(name for pair in SCORE_PAIRS for name in pair))
RERANK_PATHS = ("/rerank", "/v1/rerank", "/v2/rerank", "/reranking", "/v1/reranking")
SCORE_PATHS = ("/score", "/v1/score")


class ScoreRequest(RequestBody):
    """vLLM's ``/score``: one side of the pairs and the other, as one text or a list (1:1, 1:N or
    N:N), under any of vLLM's names for them."""

    model: str | None = None
    text_1: _Texts | None = None
    text_2: _Texts | None = None
    queries: _Texts | None = None
    documents: _Texts | None = None
    items: _Texts | None = None
    data_1: _Texts | None = None
    data_2: _Texts | None = None
    #: Accepted, unused: see RerankRequest.priority.
    priority: int = 0

    @model_validator(mode="after")
    def _one_pair(self) -> ScoreRequest:
        names = " or ".join(f"{a} and {b}" for a, b in SCORE_PAIRS)
        given = [name for name in _SIDES if getattr(self, name) is not None]
        complete = [pair for pair in SCORE_PAIRS if set(pair) <= set(given)]
        if not complete:
            partial = next((pair for pair in SCORE_PAIRS if given and given[0] in pair), SCORE_PAIRS[0])
            missing = next(name for name in partial if name not in given)
            raise InvalidRequest(missing, f"is required: send the texts to score as {names}")
        extra = [name for name in given if name not in complete[0]]
        if extra:
            raise InvalidRequest(extra[0], f"send the texts to score once, as {names}")
        return self

    def sides(self) -> tuple[tuple[str, list[str]], tuple[str, list[str]]]:
        """(name, texts) of each side, as the client named them."""
        pair = next(p for p in SCORE_PAIRS if all(getattr(self, name) is not None for name in p))
        return tuple((name, _as_list(getattr(self, name))) for name in pair)  # type: ignore[return-value]


class RerankDocument(StrictModel):
    """Jina's and Cohere's document object; its ``text`` is what is ranked."""

    text: str


#: A document as a string or as an object; tagged, so a bad object's error names its own path.
_Document = Annotated[
    Annotated[str, Tag("document=text")] | Annotated[RerankDocument, Tag("document=object")],
    Discriminator(lambda v: "document=text" if isinstance(v, str) else "document=object")]


class RerankRequest(RequestBody):
    """The union of the rerank bodies: Jina's and vLLM's (``documents``, ``top_n``,
    ``return_documents``), Cohere's v2 (``max_tokens_per_doc``, ``priority``), llama-server's
    (``documents``, ``top_n``) and TEI's (``texts``, ``return_text``, ``raw_scores``)."""

    model: str | None = None
    query: str
    documents: list[_Document] | None = None
    #: TEI's name for the documents; the answer is then TEI's bare list.
    texts: list[str] | None = None
    #: How many of the best results to return; left out or 0, all of them.
    top_n: int | None = Field(None, ge=0)
    #: Jina's: each result carries its document (vLLM always sends it).
    return_documents: bool = True
    #: TEI's: each result carries its text.
    return_text: bool = False
    #: Accepted, unused: TEI's scores before a cross-encoder's sigmoid; a cosine has none.
    raw_scores: bool = False
    #: Cohere's: a longer document is cut to its first this many tokens before it is scored.
    max_tokens_per_doc: int | None = Field(None, ge=1)
    #: Accepted, unused: embeddings run between two generation steps, ahead of every queued
    #: generation, so there is nothing to order a scoring request against.
    priority: int = 0
    #: Refused unless null: no model here finds relevant spans.
    relevant_spans: Any = None

    @model_validator(mode="after")
    def _one_list(self) -> RerankRequest:
        if (self.documents is None) == (self.texts is None):
            raise InvalidRequest("documents", "send the documents to rank once, as documents (or texts)")
        if self.relevant_spans is not None:
            raise InvalidRequest("relevant_spans", "is not supported: scores here are embedding "
                                 "similarities, which point at no span; remove relevant_spans")
        return self

    @property
    def field(self) -> str:
        return "documents" if self.documents is not None else "texts"

    def document_texts(self) -> list[str]:
        return [d if isinstance(d, str) else d.text for d in (self.documents or self.texts or [])]


def _as_list(texts: _Texts) -> list[str]:
    return [texts] if isinstance(texts, str) else list(texts)


def pairs(first: tuple[str, list[str]], second: tuple[str, list[str]]) -> list[tuple[int, int]]:
    """Index pairs by vLLM's rule: one text of the first side against every text of the second
    (1:N), or each with its counterpart (N:N)."""
    (name_1, texts_1), (name_2, texts_2) = first, second
    for name, texts in (first, second):
        if not texts:
            raise InvalidRequest(name, "must hold at least one text")
        if len(texts) > MAX_INPUTS:
            raise InvalidRequest(name, f"holds {len(texts)} texts; at most {MAX_INPUTS} per request",
                                 len(texts))
    if len(texts_1) == 1:
        return [(0, j) for j in range(len(texts_2))]
    if len(texts_1) != len(texts_2):
        raise InvalidRequest(name_2, f"holds {len(texts_2)} texts for the {len(texts_1)} of {name_1}: "
                             f"pairs are one {name_1} text with every {name_2} text, or text by text "
                             "(equal lengths)")
    return [(i, i) for i in range(len(texts_1))]


async def rerank(engine: AsyncEngine, body: RerankRequest) -> tuple[list[tuple[int, float]], int]:
    """(document index, score) best first, cut to ``top_n``, and the tokens embedded."""
    texts = body.document_texts()
    pairs(("query", [body.query]), (body.field, texts))  # the count checks
    named = [("query", body.query), *((f"{body.field}[{i}]", t) for i, t in enumerate(texts))]
    most = body.max_tokens_per_doc

    def cut(field: str, ids: list[int]) -> list[int]:
        return ids if field == "query" or most is None else ids[:most]

    vectors, tokens = await embed_texts(engine, named, cut)
    scores = [(i, float(np.dot(vectors[0], vectors[i + 1]))) for i in range(len(texts))]
    scores.sort(key=lambda s: -s[1])
    return scores[: body.top_n or None], tokens


def rerank_response(body: RerankRequest, ranked: list[tuple[int, float]], *, model: str,
                    tokens: int) -> dict[str, Any] | list[dict[str, Any]]:
    """TEI's list for a ``texts`` body; otherwise Jina's object, which vLLM, Cohere's client and
    llama-server's clients all read (each reads ``results[].index`` and ``relevance_score``)."""
    texts = body.document_texts()
    if body.texts is not None:
        return [{"index": i, "score": s, **({"text": texts[i]} if body.return_text else {})}
                for i, s in ranked]
    results = [{"index": i, "relevance_score": s, **({"document": {"text": texts[i]}}
                                                     if body.return_documents else {})} for i, s in ranked]
    return {"id": f"rerank-{uuid.uuid4().hex}", "object": "list", "model": model,
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}, "results": results}


def register_scoring_routes(app: FastAPI, pool: ModelPool) -> None:
    """``/score`` and ``/v1/score``; the rerank endpoints of RERANK_PATHS."""

    async def score(body: ScoreRequest) -> dict[str, Any]:
        first, second = body.sides()
        index_pairs = pairs(first, second)
        named = [(f"{name}[{i}]" if len(texts) > 1 else name, t) for name, texts in (first, second)
                 for i, t in enumerate(texts)]
        async with pool.route(body.model) as route:
            require_embeddings(route, body.model, "/score")
            vectors, tokens = await embed_texts(route.engine, named)
        offset = len(first[1])
        data = [{"index": k, "object": "score", "score": float(np.dot(vectors[i], vectors[offset + j]))}
                for k, (i, j) in enumerate(index_pairs)]
        return {"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                "model": route.served_name, "data": data,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0}}

    async def rerank_documents(body: RerankRequest) -> Any:
        async with pool.route(body.model) as route:
            require_embeddings(route, body.model, "rerank")
            ranked, tokens = await rerank(route.engine, body)
        return rerank_response(body, ranked, model=route.served_name, tokens=tokens)

    for path in SCORE_PATHS:
        app.add_api_route(path, score, methods=["POST"])
    for path in RERANK_PATHS:
        app.add_api_route(path, rerank_documents, methods=["POST"])
