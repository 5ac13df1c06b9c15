"""Embeddings, in no API's words: what every surface that serves them (OpenAI's ``/v1/embeddings``,
Ollama's ``/api/embed`` and ``/api/embeddings``, llama-server's ``/embedding``, Cohere's embed,
the relevance scores) shares, returning vectors and token counts that each renders in its own shape.

The whole request's inputs are one batch, run by the backend on the engine's model thread
between two generation steps (``AsyncEngine.embed_async``), so concurrent embeddings and
completions never touch the model from two threads. Vectors are the mean of each input's final
hidden states, L2-normalised (``LlmBackend.embed_batch``). The refusals name the lifecycle's
``input`` / ``input[i]``; a surface whose client sent another field says it in its own words
(:mod:`ruvllm.server.http.field_names`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from ruvllm.errors import InvalidRequest
from ruvllm.server.lifecycle.model_pool import Route
from ruvllm.serving import AsyncEngine
from ruvllm.tokenizer import require_encodable

#: The most inputs one request may embed (OpenAI's limit, which every surface keeps).
MAX_INPUTS = 2048


@attrs.frozen(eq=False)
class Embedded:
    """A request's inputs embedded: one unit vector a row, in the order sent, and the tokens each
    input was embedded from; each surface renders them in its own shape."""

    #: float32 ``[inputs, dimensions]``, each row L2-normalised; no rows for no inputs.
    vectors: np.ndarray
    #: The tokens of each input, as embedded (after any cut).
    token_counts: tuple[int, ...]

    @property
    def tokens(self) -> int:
        """All the tokens embedded: what a surface reports as the request's usage."""
        return sum(self.token_counts)


def require_embeddings(route: Route, model: str | None, endpoint: str) -> None:
    """Refuse, naming ``model``, a route whose backend computes no embeddings."""
    engine = route.engine
    if not engine.capabilities.embeddings:
        raise InvalidRequest("model", f"{route.entry!r} is served by backend {engine.backend_name!r}, "
                             "which cannot produce embeddings; serve it with --backend candle_like or "
                             f"llamacpp for {endpoint}", model)


def embedding_limit(engine: AsyncEngine) -> int:
    """The most tokens one input may have (the backend's embedding limit, else the context)."""
    return engine.info.embedding_tokens or engine.info.context_length


def split_inputs(value: str | list[str] | list[int] | list[list[int]]) -> list[str | list[int]]:
    """Each input of the request: a string, one token-id list, or a list of either."""
    if isinstance(value, str):
        return [value]
    if value and all(isinstance(t, int) for t in value):
        return [list(value)]  # type: ignore[arg-type]
    items = list(value)
    if not items:
        raise InvalidRequest("input", "must not be empty")
    if len(items) > MAX_INPUTS:
        raise InvalidRequest("input", f"holds {len(items)} inputs; at most {MAX_INPUTS} per request",
                             len(items))
    return items  # type: ignore[return-value]


async def input_ids(engine: AsyncEngine, items: list[str | list[int]], *,
                    fields: list[str] | None = None) -> list[list[int]]:
    """Token ids of every input (strings tokenized by the engine with its special tokens, on its
    model thread; all of them queued at once, so they are tokenized in one visit); a bad input is
    named by its entry of ``fields`` (default: ``input[i]``)."""
    names = fields if fields is not None else [f"input[{i}]" if len(items) > 1 else "input"
                                                for i in range(len(items))]
    for name, item in zip(names, items, strict=True):  # all checked before any is queued
        if isinstance(item, str):
            if not item:
                raise InvalidRequest(name, "must not be an empty string")
            require_encodable(name, item)
    return list(await asyncio.gather(*(
        engine.encode_async(item, add_special=True) if isinstance(item, str) else _ready(list(item))
        for item in items)))


async def embed_inputs(engine: AsyncEngine, items: list[str | list[int]], *,
                       cut: Callable[[list[int]], list[int]] | None = None) -> Embedded:
    """``items`` (what :func:`split_inputs` gives; none: no vectors) tokenized and embedded in one
    batch, each from the ids ``cut(ids)`` keeps (None: all of them)."""
    ids = await input_ids(engine, items) if items else []
    if cut is not None:
        ids = [cut(x) for x in ids]
    vectors = np.asarray(await engine.embed_async(ids)) if ids else np.zeros((0, 0), dtype=np.float32)
    return Embedded(vectors, tuple(len(x) for x in ids))


async def embed_texts(engine: AsyncEngine, named: Sequence[tuple[str, str]],
                      cut: Callable[[str, list[int]], list[int]] | None = None) -> tuple[np.ndarray, int]:
    """Unit vectors of the texts of ``named`` ((field, text) pairs; a bad text is refused naming
    its field), one row each, and the tokens embedded; ``cut(field, ids)`` gives the ids a text
    is embedded from (None: all). Each distinct text is tokenized once and each distinct token
    list embedded once (a query is not recomputed per document)."""
    texts = list(dict.fromkeys(text for _, text in named))
    first_field = {text: field for field, text in reversed(named)}
    tokenized = await input_ids(engine, texts, fields=[first_field[t] for t in texts])
    ids = dict(zip(texts, tokenized, strict=True))
    wanted = [tuple(cut(field, ids[text]) if cut is not None else ids[text]) for field, text in named]
    distinct = list(dict.fromkeys(wanted))
    try:
        vectors = np.asarray(await engine.embed_async([list(x) for x in distinct]))
    except InvalidRequest as exc:
        first_of = {x: field for (field, _), x in reversed(list(zip(named, wanted, strict=True)))}
        raise _renamed(exc, [first_of[x] for x in distinct]) from None
    row = {x: k for k, x in enumerate(distinct)}
    return vectors[[row[x] for x in wanted]], sum(len(x) for x in distinct)


def _renamed(exc: InvalidRequest, fields: list[str]) -> InvalidRequest:
    """The engine's refusal of ``input[k]`` naming the field the client sent the text in."""
    found = re.fullmatch(r"input(?:\[(\d+)\])?", exc.field)
    if found is None:
        return exc
    field = fields[int(found.group(1) or 0)]
    return InvalidRequest(field, str(exc).removeprefix(f"{exc.field}: "), exc.value)


async def _ready(ids: list[int]) -> list[int]:
    return ids


def check_dimensions(dimensions: int | None) -> None:
    """``dimensions`` is refused: a shortened vector (truncated and renormalised) is a valid
    embedding only for Matryoshka-trained models, and the decoder models served here are not."""
    if dimensions is not None:
        raise InvalidRequest("dimensions", "is not supported: this model is not Matryoshka-trained, so a "
                             "shortened vector would not be a valid embedding; remove dimensions", dimensions)
