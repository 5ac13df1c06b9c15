"""llama-server's ``/props``, ``/slots`` and non-OpenAI ``/embedding(s)`` on the real server.

``/props`` must agree with what the server does (the context ``/health`` reports, the defaults
a ``/completion`` without settings gets, the engine's ``max_num_seqs``), and the embeddings are
``/v1/embeddings``' vectors under llama.cpp's normalisations.
"""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from server_helpers import API_KEY

AUTH = {"authorization": f"Bearer {API_KEY}"}


def get(server, path: str, **params) -> httpx.Response:
    return httpx.get(server.url + path, params=params, headers=AUTH, timeout=60)


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=60)


def test_props_say_what_the_server_does(server):
    props = get(server, "/props").json()
    health = get(server, "/health").json()
    (model,) = health["models"].values()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == model["max_request_tokens"] == settings["params"]["n_ctx"]
    assert props["total_slots"] == 16  # the engine's default max_num_seqs
    info = get(server, "/tokenizer_info").json()
    assert props["chat_template"] == info["chat_template"]
    assert (props["bos_token"], props["eos_token"]) == (info["bos_token"], info["eos_token"])
    assert props["model_path"].endswith(".gguf") and props["modalities"] == {"vision": False, "audio": False}
    # The defaults are those a /completion that sets nothing is answered with.
    made = post(server, "/completion", {"prompt": "Hi", "n_predict": 2}).json()["generation_settings"]
    differing = {k for k in made if made[k] != settings["params"][k]}
    assert differing == {"n_predict"}, differing
    assert settings["params"]["n_predict"] == 512  # this server's max_tokens_limit
    assert get(server, "/props", modle="x").status_code == 400


def test_slots_are_refused_saying_why(server):
    r = get(server, "/slots")
    assert r.status_code == 501 and "no fixed slots" in r.json()["error"]["message"]


def test_embedding_is_the_openai_vector_in_llama_servers_shape(server):
    texts = ["The cat sat on the mat.", "A dog ran."]
    openai = post(server, "/v1/embeddings", {"input": texts}).json()["data"]
    for path, field in (("/embedding", "content"), ("/embeddings", "input")):
        answer = post(server, path, {field: texts}).json()
        assert [a["index"] for a in answer] == [0, 1]
        for got, want in zip(answer, openai, strict=True):
            (vector,) = got["embedding"]
            np.testing.assert_allclose(vector, want["embedding"], rtol=1e-5, atol=1e-6)
    (single,) = post(server, "/embedding", {"content": texts[0]}).json()
    np.testing.assert_allclose(single["embedding"][0], openai[0]["embedding"], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("embd_normalize", "measure"), [
    (2, lambda v: np.linalg.norm(v)),
    (1, lambda v: np.abs(v).sum()),
    (0, lambda v: np.abs(v).max() / 32760),
    (3, lambda v: (np.abs(v) ** 3).sum() ** (1 / 3)),
])
def test_embd_normalize_is_llama_cpps(server, embd_normalize, measure):
    body = {"content": "Hello there", "embd_normalize": embd_normalize}
    (answer,) = post(server, "/embedding", body).json()
    vector = np.array(answer["embedding"][0])
    assert measure(vector) == pytest.approx(1.0, rel=1e-6)


def test_what_the_engine_cannot_give_is_refused_by_name(server):
    r = post(server, "/embedding", {"content": "Hi", "embd_normalize": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "embd_normalize"
    r = post(server, "/embedding", {"content": "Hi", "input": "Hi"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "content"
    r = post(server, "/embedding", {"content": [[-1]]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "content", r.text  # the field sent
    r = post(server, "/embeddings", {"input": []})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input", r.text
