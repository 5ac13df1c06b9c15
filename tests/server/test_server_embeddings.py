"""``POST /v1/embeddings`` with the official ``openai`` client against the real server (llamacpp,
embedded SmolLM2), plus a backend without embeddings on the fake engine of tests/engine."""

from __future__ import annotations

import base64
import sys
import threading
from pathlib import Path

import httpx
import numpy as np
import openai
import pytest
from fastapi.testclient import TestClient
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.server.app import ServerSettings, create_app
from ruvllm.testing.embeddings import (
    TOPIC_TEXTS,
    assert_same_direction,
    assert_separates_topics,
    assert_unit_rows,
)
from server_helpers import API_KEY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from engine_fakes import FakeBackend, PagedFakeExecutor

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CAT, KITTEN, MONEY, STOCKS = TOPIC_TEXTS


def vectors(resp) -> np.ndarray:
    return np.array([d.embedding for d in sorted(resp.data, key=lambda d: d.index)], dtype=np.float32)


def post(server, body: dict) -> httpx.Response:
    return httpx.post(server.url + "/v1/embeddings", json=body, headers=AUTH, timeout=60)


def test_client_batch_is_unit_vectors_with_real_usage(client, server, model_name):
    texts = [CAT, KITTEN, MONEY, STOCKS]
    resp = client.embeddings.create(model=model_name, input=texts, encoding_format="float")
    assert resp.object == "list" and resp.model == model_name
    assert [d.index for d in resp.data] == [0, 1, 2, 3] and all(d.object == "embedding" for d in resp.data)
    assert_unit_rows(vectors(resp), dim=576)  # SmolLM2-135M's hidden size
    counts = [httpx.post(server.url + "/tokenize", json={"prompt": t}, headers=AUTH).json()["count"]
              for t in texts]
    assert resp.usage.prompt_tokens == sum(counts) == resp.usage.total_tokens


def test_similar_sentences_score_higher_than_unrelated(client, model_name):
    assert_separates_topics(vectors(client.embeddings.create(
        model=model_name, input=list(TOPIC_TEXTS), encoding_format="float")))


def test_same_text_alone_and_in_a_batch(client, model_name):
    alone = vectors(client.embeddings.create(model=model_name, input=MONEY, encoding_format="float"))[0]
    batch = vectors(client.embeddings.create(
        model=model_name, input=[CAT, "word", MONEY, STOCKS * 6], encoding_format="float"))
    assert_same_direction(batch[2], alone)
    again = vectors(client.embeddings.create(model=model_name, input=MONEY, encoding_format="float"))[0]
    np.testing.assert_array_equal(again, alone)  # nothing of the batch stays in the context


def test_base64_decodes_to_the_float_result(client, server, model_name):
    floats = post(server, {"model": model_name, "input": [CAT, MONEY], "encoding_format": "float"}).json()
    b64 = post(server, {"model": model_name, "input": [CAT, MONEY], "encoding_format": "base64"}).json()
    for f, b in zip(floats["data"], b64["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        np.testing.assert_array_equal(decoded, np.array(f["embedding"], dtype=np.float32))
    assert b64["usage"] == floats["usage"]
    # The openai client asks for base64 when no format is given and decodes it itself.
    default = client.embeddings.create(model=model_name, input=[CAT, MONEY])
    np.testing.assert_array_equal(vectors(default), np.array([f["embedding"] for f in floats["data"]],
                                                             dtype=np.float32))


def test_token_id_inputs_match_text(client, server, model_name):
    ids = httpx.post(server.url + "/tokenize", json={"prompt": KITTEN}, headers=AUTH).json()["tokens"]
    text = vectors(client.embeddings.create(model=model_name, input=KITTEN, encoding_format="float"))
    one = client.embeddings.create(model=model_name, input=ids, encoding_format="float")
    two = client.embeddings.create(model=model_name, input=[ids, ids[:3]], encoding_format="float")
    np.testing.assert_array_equal(vectors(one), text)
    assert_same_direction(vectors(two)[0], text[0])
    assert one.usage.prompt_tokens == len(ids) and two.usage.prompt_tokens == len(ids) + 3


def test_refusals_name_the_field(client, server, model_name):
    with pytest.raises(openai.BadRequestError) as exc:
        client.embeddings.create(model=model_name, input=CAT, dimensions=64)
    assert exc.value.body["param"] == "dimensions" and "Matryoshka" in exc.value.body["message"]
    long_text = "word " * 600  # beyond the llamacpp embedding context (embedding_tokens = 512)
    with pytest.raises(openai.BadRequestError) as exc:
        client.embeddings.create(model=model_name, input=[CAT, long_text])
    assert exc.value.body["param"] == "input[1]" and "at most 512 tokens" in exc.value.body["message"]
    for bad, param in (("", "input"), ([], "input"), ([[1, 2], [10**9]], "input[1]")):
        r = post(server, {"model": model_name, "input": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = post(server, {"model": "some-other-model", "input": CAT})
    assert r.status_code == 404


def test_concurrent_embeddings_and_generation(server, model_name):
    """Embeddings requests run on the engine's model thread between generation steps: all of
    them, and a completion running meanwhile, finish with the answers they give alone."""
    # A patient client: the shared 2-core test machine can be many times oversubscribed.
    client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=240)
    solo = vectors(client.embeddings.create(model=model_name, input=[CAT, STOCKS], encoding_format="float"))
    ref = client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=8, temperature=0)
    results: dict[str, object] = {}

    def embed(i: int) -> None:
        results[f"e{i}"] = vectors(client.embeddings.create(model=model_name, input=[CAT, STOCKS],
                                                            encoding_format="float"))

    def complete() -> None:
        results["c"] = client.completions.create(model=model_name, prompt="Once upon a time", max_tokens=8,
                                                 temperature=0).choices[0].text

    threads = [threading.Thread(target=complete)]
    threads += [threading.Thread(target=embed, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=250)
    assert results["c"] == ref.choices[0].text
    for i in range(3):
        np.testing.assert_array_equal(results[f"e{i}"], solo)


def test_backend_without_embeddings_is_a_400_naming_the_model():
    engine = ServingEngine(FakeBackend(PagedFakeExecutor(num_blocks=64, block_size=4)),
                           EngineOptions(block_size=4))
    with TestClient(create_app(engine, ServerSettings(model_name="tiny-fake"))) as c:
        r = c.post("/v1/embeddings", json={"model": "tiny-fake", "input": "hello"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "model" and "'tiny-fake'" in err["message"] and "cannot produce embeddings" in \
        err["message"]


def test_unknown_fields_are_refused_by_name(server, model_name):
    r = post(server, {"model": model_name, "input": CAT, "encoding_fromat": "base64", "truncate": 8})
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"] == "encoding_fromat"
    assert "encoding_fromat" in error["message"] and "truncate" in error["message"]
    # user is accepted and changes nothing: an embedding has no tenant.
    plain, for_user = (post(server, {"model": model_name, "input": CAT, **extra})
                       for extra in ({}, {"user": "u1"}))
    assert for_user.status_code == 200 and for_user.json()["data"] == plain.json()["data"], for_user.text
