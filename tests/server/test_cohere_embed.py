"""Cohere's embed API (``/v2/embed``, ``/v1/embed``) with Cohere's official clients against the
real server (llamacpp, embedded SmolLM2): the vectors are ``/v1/embeddings``' in Cohere's types
(``binary``/``ubinary`` the packed signs, ``base64`` the float32 bytes), and ``truncate`` /
``max_tokens`` cut an input as Cohere's documentation says."""

from __future__ import annotations

import base64

import cohere
import httpx
import numpy as np
import pytest
from server_helpers import API_KEY, SHORT_EMBEDDING_TOKENS

AUTH = {"Authorization": f"Bearer {API_KEY}"}
TEXTS = ["The cat sat on the mat.", "The stock market fell sharply today."]


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def openai_vectors(server, inputs) -> np.ndarray:
    data = post(server, "/v1/embeddings", {"input": inputs}).json()["data"]
    return np.array([d["embedding"] for d in data], dtype=np.float32)


def test_v2_client_gets_the_servers_vectors_in_every_type(server, model_name):
    co = cohere.ClientV2(api_key=API_KEY, base_url=server.url, timeout=120)
    r = co.embed(model=model_name, input_type="search_document", texts=TEXTS,
                 embedding_types=["float", "base64", "binary", "ubinary"])
    floats = np.array(r.embeddings.float_, dtype=np.float32)
    np.testing.assert_array_equal(floats, openai_vectors(server, TEXTS))
    decoded = np.array([np.frombuffer(base64.b64decode(b), dtype="<f4") for b in r.embeddings.base64])
    np.testing.assert_array_equal(decoded, floats)
    signs = np.packbits(floats >= 0, axis=1).astype(int)
    assert np.array_equal(np.array(r.embeddings.ubinary), signs)
    assert np.array_equal(np.array(r.embeddings.binary), signs - 128)
    assert r.texts == TEXTS and r.meta.billed_units.input_tokens > 0


def test_v1_client_gets_a_list_of_floats(server, model_name):
    co = cohere.Client(api_key=API_KEY, base_url=server.url, timeout=120)
    r = co.embed(model=model_name, input_type="search_query", texts=TEXTS)
    assert r.response_type == "embeddings_floats"
    np.testing.assert_array_equal(np.array(r.embeddings, dtype=np.float32), openai_vectors(server, TEXTS))


def test_truncate_and_max_tokens_cut_as_cohere_says(short_embedding_server):
    server = short_embedding_server
    long_text = "word " * 80  # beyond the server's embedding limit
    ids = post(server, "/tokenize", {"prompt": long_text}).json()["tokens"]
    assert len(ids) > SHORT_EMBEDDING_TOKENS
    refused = post(server, "/v2/embed", {"texts": [long_text], "truncate": "NONE"})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "texts[0]", refused.text
    for truncate, kept in (("END", ids[:SHORT_EMBEDDING_TOKENS]), ("START", ids[-SHORT_EMBEDDING_TOKENS:])):
        r = post(server, "/v2/embed", {"texts": [long_text], "truncate": truncate})
        assert r.status_code == 200, r.text
        np.testing.assert_allclose(r.json()["embeddings"]["float"], openai_vectors(server, [kept]), atol=1e-5)
    short = post(server, "/v2/embed", {"inputs": [{"content": [{"type": "text", "text": TEXTS[0]}]}],
                                       "max_tokens": 3}).json()
    head = post(server, "/tokenize", {"prompt": TEXTS[0]}).json()["tokens"][:3]
    np.testing.assert_allclose(short["embeddings"]["float"], openai_vectors(server, [head]), atol=1e-5)
    assert short["meta"]["billed_units"]["input_tokens"] == 3


@pytest.mark.parametrize(("body", "param"), [
    ({"texts": TEXTS, "embedding_types": ["int8"]}, "embedding_types[0]"),
    ({"texts": TEXTS, "embedding_types": ["float", "bits"]}, "embedding_types[1]"),
    ({"texts": TEXTS, "output_dimension": 256}, "output_dimension"),
    ({"texts": TEXTS, "images": ["data:image/png;base64,iVBORw0K"]}, "images"),
    ({"inputs": [{"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
     "inputs[0].content"),
    ({"texts": TEXTS, "inputs": [{"content": [{"type": "text", "text": "a"}]}]}, "texts"),
    ({"texts": ["a", ""]}, "texts[1]"),
    ({"texts": TEXTS, "input_type": "image"}, "input_type"),
])
def test_refusals_name_the_field(server, body, param):
    r = post(server, "/v2/embed", body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
