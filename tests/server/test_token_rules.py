"""vLLM's ``allowed_token_ids`` and ``bad_words`` through the real server (llamacpp, embedded
SmolLM2): greedy answers that would write a word do not once it is banned (start of the answer or
after a space), and an answer limited to some tokens is made of them only."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
FLAG = "The colours of the French flag are blue, white and"


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def complete(server, **body) -> dict:
    r = post(server, "/v1/completions", {"prompt": FLAG, "max_tokens": 8, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_bad_words_are_never_written(server):
    assert complete(server)["text"].startswith(" red")
    banned = complete(server, bad_words=["red"])["text"]
    assert "red" not in banned.split() and not banned.startswith(" red")
    ask = {"messages": [{"role": "user", "content": FLAG}], "max_tokens": 12, "temperature": 0}
    chat = post(server, "/v1/chat/completions", {**ask, "bad_words": ["red", "Red"]})
    assert chat.status_code == 200, chat.text
    words = chat.json()["choices"][0]["message"]["content"].replace(",", " ").replace(".", " ").split()
    assert "red" not in words and "Red" not in words


def test_allowed_token_ids_are_all_the_answer_is_made_of(server):
    allowed = post(server, "/tokenize", {"prompt": " a b", "add_special_tokens": False}).json()["tokens"]
    choice = complete(server, allowed_token_ids=allowed, return_token_ids=True)
    assert set(choice["token_ids"]) <= set(allowed) and len(choice["token_ids"]) == 8


@pytest.mark.parametrize(("body", "param"), [
    ({"bad_words": ["  "]}, "bad_words[0]"),
    ({"bad_words": [""]}, "bad_words[0]"),
    ({"allowed_token_ids": [10**9]}, "allowed_token_ids"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
])
def test_refusals_name_the_field(server, body, param):
    r = post(server, "/v1/completions", {"prompt": FLAG, "max_tokens": 2, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
