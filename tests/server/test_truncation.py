"""vLLM's ``truncate_prompt_tokens`` (and ``truncation_side``) through the real server (llamacpp,
embedded SmolLM2): the prompt or input is the one cut to that many tokens, its last by default
(vLLM's), its first with ``right``; -1 is the model's limit; left out, nothing is cut."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from server_helpers import API_KEY, SHORT_EMBEDDING_TOKENS

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "One, two, three, four, five, six, seven, eight, nine, ten, eleven,"


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def ids_of(server, text: str) -> list[int]:
    return post(server, "/tokenize", {"prompt": text}).json()["tokens"]


@pytest.mark.parametrize("side", [None, "left", "right"])
def test_a_completion_reads_the_cut_prompt(server, side):
    ids = ids_of(server, PROMPT)
    kept = ids[:6] if side == "right" else ids[-6:]
    body = {"prompt": PROMPT, "max_tokens": 4, "temperature": 0, "truncate_prompt_tokens": 6,
            "truncation_side": side, "return_token_ids": True}
    cut = post(server, "/v1/completions", body).json()
    whole = post(server, "/v1/completions", {"prompt": kept, "max_tokens": 4, "temperature": 0}).json()
    assert cut["choices"][0]["prompt_token_ids"] == kept and cut["usage"]["prompt_tokens"] == 6
    assert cut["choices"][0]["text"] == whole["choices"][0]["text"]


def test_chat_prompt_is_cut_from_the_left(server):
    messages = [{"role": "user", "content": PROMPT}]
    ids = post(server, "/tokenize", {"messages": messages}).json()["tokens"]
    r = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 2,
                                              "truncate_prompt_tokens": 10, "return_token_ids": True}).json()
    assert r["prompt_token_ids"] == ids[-10:] and r["usage"]["prompt_tokens"] == 10


def test_embeddings_are_those_of_the_cut_input(short_embedding_server):
    server = short_embedding_server
    long_text = "word " * 80  # beyond the server's embedding limit
    assert post(server, "/v1/embeddings", {"input": long_text}).status_code == 400
    ids = ids_of(server, long_text)
    assert len(ids) > SHORT_EMBEDDING_TOKENS
    for body, kept in (({"truncate_prompt_tokens": -1}, ids[-SHORT_EMBEDDING_TOKENS:]),
                       ({"truncate_prompt_tokens": 8, "truncation_side": "right"}, ids[:8])):
        r = post(server, "/v1/embeddings", {"input": long_text, **body})
        assert r.status_code == 200, r.text
        expected = post(server, "/v1/embeddings", {"input": kept}).json()["data"][0]["embedding"]
        np.testing.assert_allclose(r.json()["data"][0]["embedding"], expected, atol=1e-5)
        assert r.json()["usage"]["prompt_tokens"] == len(kept)


@pytest.mark.parametrize("value", [0, -2])
def test_zero_or_below_minus_one_is_refused(server, value):
    r = post(server, "/v1/completions", {"prompt": PROMPT, "truncate_prompt_tokens": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "truncate_prompt_tokens", r.text
