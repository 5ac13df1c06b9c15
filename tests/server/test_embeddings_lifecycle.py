"""The lifecycle's embeddings speak no API (issue 62): ``embed_inputs`` gives vectors and token
counts, which each surface renders in its own shape (OpenAI's list in ``openai/embeddings.py``,
Ollama's, llama-server's and Cohere's in their routes)."""

from __future__ import annotations

import asyncio
import base64

import numpy as np
import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.server.lifecycle.embeddings import Embedded, embed_inputs, split_inputs
from ruvllm.server.openai.embeddings import embeddings_response


class _Engine:
    """Tokenizes a text as one id per character; embeds an input as a unit vector of its ids."""

    def __init__(self) -> None:
        self.embedded: list[list[list[int]]] = []

    async def encode_async(self, text: str, *, add_special: bool) -> list[int]:
        return [ord(c) for c in text]

    async def embed_async(self, inputs: list[list[int]]) -> np.ndarray:
        self.embedded.append([list(x) for x in inputs])
        rows = np.array([[len(x), sum(x) % 7 + 1.0] for x in inputs], dtype=np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_the_lifecycle_returns_vectors_and_token_counts_in_one_batch():
    engine = _Engine()
    embedded = asyncio.run(embed_inputs(engine, split_inputs(["abc", [5, 6]])))
    assert isinstance(embedded, Embedded)
    assert embedded.token_counts == (3, 2) and embedded.tokens == 5
    assert embedded.vectors.shape == (2, 2) and embedded.vectors.dtype == np.float32
    assert engine.embedded == [[[97, 98, 99], [5, 6]]]  # one batch, in the order sent


def test_a_cut_is_what_is_embedded_and_counted():
    engine = _Engine()
    embedded = asyncio.run(embed_inputs(engine, ["abcdef"], cut=lambda ids: ids[:2]))
    assert embedded.token_counts == (2,) and engine.embedded == [[[97, 98]]]


def test_no_inputs_embed_nothing():
    engine = _Engine()
    embedded = asyncio.run(embed_inputs(engine, []))
    assert embedded.token_counts == () and len(embedded.vectors) == 0 and engine.embedded == []


def test_a_bad_input_is_refused_by_the_lifecycles_name():
    with pytest.raises(InvalidRequest) as refused:
        asyncio.run(embed_inputs(_Engine(), ["a", ""]))
    assert refused.value.field == "input[1]"


def test_openai_renders_the_neutral_result_as_its_list():
    vectors = np.array([[0.6, 0.8], [1.0, 0.0]], dtype=np.float32)
    embedded = Embedded(vectors, (3, 4))
    floats = embeddings_response(embedded, model="m", encoding_format="float")
    assert floats == {"object": "list", "model": "m", "usage": {"prompt_tokens": 7, "total_tokens": 7},
                      "data": [{"object": "embedding", "index": 0, "embedding": vectors[0].tolist()},
                               {"object": "embedding", "index": 1, "embedding": [1.0, 0.0]}]}
    packed = embeddings_response(embedded, model="m", encoding_format="base64")["data"][0]["embedding"]
    assert np.frombuffer(base64.b64decode(packed), dtype="<f4").tolist() == vectors[0].tolist()
