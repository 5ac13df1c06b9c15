"""vLLM's ``return_token_ids`` on chat and completions, whole and streamed, through the real
server (llamacpp, embedded SmolLM2): the prompt's ids are what ``/tokenize`` gives, each choice's
are the tokens its text decodes from (as many as ``completion_tokens``), and a stream's chunks
carry the same ids, in order, as the whole answer (agent and RL clients continue from them)."""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "One, two, three, four,"
MESSAGES = [{"role": "user", "content": "Name three colours."}]


def post(server, path: str, body: dict) -> httpx.Response:
    r = httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)
    assert r.status_code == 200, r.text
    return r


def chunks(server, path: str, body: dict) -> list[dict]:
    text = post(server, path, {**body, "stream": True}).text
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def decoded(server, ids: list[int]) -> str:
    return post(server, "/detokenize", {"tokens": ids}).json()["prompt"]


def streamed_ids(events: list[dict], index: int) -> list[int]:
    return [t for e in events for c in e["choices"] if c["index"] == index for t in c["token_ids"]]


def test_completions_carry_each_choices_prompt_and_tokens(server):
    prompts = [PROMPT, "The sky is"]
    body = {"prompt": prompts, "max_tokens": 6, "temperature": 0, "n": 2, "return_token_ids": True}
    data = post(server, "/v1/completions", body).json()
    assert "prompt_token_ids" not in data
    for choice in data["choices"]:
        prompt = prompts[choice["index"] // 2]
        assert choice["prompt_token_ids"] == post(server, "/tokenize", {"prompt": prompt}).json()["tokens"]
        assert decoded(server, choice["token_ids"]) == choice["text"] and len(choice["token_ids"]) == 6
    assert data["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in data["choices"])
    plain = post(server, "/v1/completions", {**body, "return_token_ids": None}).json()
    assert all("token_ids" not in c and "prompt_token_ids" not in c for c in plain["choices"])


@pytest.mark.parametrize("extra", [{}, {"echo": True, "logprobs": 2}], ids=["plain", "echo-logprobs"])
def test_a_completion_stream_carries_the_same_ids_in_order(server, extra):
    body = {"prompt": PROMPT, "max_tokens": 8, "temperature": 0, "return_token_ids": True, **extra}
    whole = post(server, "/v1/completions", body).json()["choices"][0]
    events = chunks(server, "/v1/completions", body)
    firsts = [c for e in events for c in e["choices"] if "prompt_token_ids" in c]
    assert len(firsts) == 1 and firsts[0]["prompt_token_ids"] == whole["prompt_token_ids"]
    assert firsts[0]["token_ids"] == []  # the prompt's chunk comes before any token
    assert streamed_ids(events, 0) == whole["token_ids"]


def test_chat_carries_the_prompt_once_and_each_choices_tokens(server):
    body = {"messages": MESSAGES, "max_tokens": 8, "temperature": 0, "return_token_ids": True}
    data = post(server, "/v1/chat/completions", body).json()
    prompt = post(server, "/tokenize", {"messages": MESSAGES}).json()["tokens"]
    assert data["prompt_token_ids"] == prompt and data["usage"]["prompt_tokens"] == len(prompt)
    choice = data["choices"][0]
    assert len(choice["token_ids"]) == data["usage"]["completion_tokens"]
    assert decoded(server, choice["token_ids"]).startswith(choice["message"]["content"])
    events = chunks(server, "/v1/chat/completions", body)
    assert events[0]["prompt_token_ids"] == prompt and all("prompt_token_ids" not in e for e in events[1:])
    assert streamed_ids(events, 0) == choice["token_ids"]


def test_tokens_as_token_ids_name_every_logprobs_token_by_id(server):
    """vLLM's ``return_tokens_as_token_ids``: ``token_id:<id>`` wherever logprobs name a token
    (chat's entries and alternatives, completions' lists, the echoed prompt's too)."""
    ask = {"messages": MESSAGES, "max_tokens": 4, "temperature": 0, "logprobs": True, "top_logprobs": 2}
    chat = post(server, "/v1/chat/completions", {**ask, "return_token_ids": True,
                                                 "return_tokens_as_token_ids": True}).json()["choices"][0]
    entries = chat["logprobs"]["content"]
    assert [e["token"] for e in entries] == [f"token_id:{t}" for t in chat["token_ids"][:len(entries)]]
    assert all(a["token"].startswith("token_id:") for e in entries for a in e["top_logprobs"])
    assert entries[0]["bytes"] == list(entries[0]["token"].encode())
    done = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0, "echo": True,
                                            "logprobs": 1, "return_tokens_as_token_ids": True}).json()
    lists = done["choices"][0]["logprobs"]
    prompt = post(server, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    assert lists["tokens"][:len(prompt)] == [f"token_id:{t}" for t in prompt]
    assert all(k.startswith("token_id:") for top in lists["top_logprobs"] if top for k in top)
