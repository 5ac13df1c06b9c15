"""vLLM's ``prompt_logprobs`` on completions and chat through the real server (llamacpp,
embedded SmolLM2): per prompt position (None for the first) the prompt token and the ``k`` most
probable, with logprobs equal to what ``echo`` + ``logprobs`` reports for the same prompt, and
ranks that agree with them."""

from __future__ import annotations

import httpx
import pytest
from server_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "The capital of France is Paris. The capital of Italy is"


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def check_positions(positions: list, prompt_ids: list[int], k: int) -> None:
    assert len(positions) == len(prompt_ids) and positions[0] is None
    for token, position in zip(prompt_ids[1:], positions[1:], strict=True):
        entry = position[str(token)]
        assert entry["rank"] >= 1 and isinstance(entry["decoded_token"], str)
        assert k <= len(position) <= k + 1  # the k best, and the prompt's token when not among them
        ranked = sorted(position.values(), key=lambda e: -e["logprob"])
        for e in position.values():
            assert e["rank"] == 1 + sum(o["logprob"] > e["logprob"] for o in ranked) or e is entry
        if entry["rank"] > k:  # outside the k best: less probable than each of them
            assert all(e["logprob"] >= entry["logprob"] for e in position.values())


def test_completion_prompt_logprobs_are_echos_with_ranks(server):
    r = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 1, "temperature": 0,
                                         "prompt_logprobs": 3})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    ids = post(server, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    check_positions(choice["prompt_logprobs"], ids, 3)
    echo = post(server, "/v1/completions", {"prompt": PROMPT, "max_tokens": 0, "echo": True,
                                            "logprobs": 0}).json()["choices"][0]["logprobs"]
    ours = [p[str(t)]["logprob"] for t, p in zip(ids[1:], choice["prompt_logprobs"][1:], strict=True)]
    assert ours == pytest.approx(echo["token_logprobs"][1:], abs=1e-4)


def test_chat_prompt_logprobs_cover_the_templated_prompt(server):
    messages = [{"role": "user", "content": "Say hi."}]
    r = post(server, "/v1/chat/completions", {"messages": messages, "max_tokens": 2, "prompt_logprobs": 0})
    assert r.status_code == 200, r.text
    data = r.json()
    ids = post(server, "/tokenize", {"messages": messages}).json()["tokens"]
    assert len(data["prompt_logprobs"]) == data["usage"]["prompt_tokens"] == len(ids)
    check_positions(data["prompt_logprobs"], ids, 0)
    assert "prompt_logprobs" not in data["choices"][0]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/completions", {"prompt": PROMPT, "stream": True, "prompt_logprobs": 1}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "stream": True,
                              "prompt_logprobs": 1}),
    ("/v1/completions", {"prompt": PROMPT, "prompt_logprobs": 21}),
])
def test_refusals_name_prompt_logprobs(server, path, body):
    r = post(server, path, {"max_tokens": 1, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_logprobs", r.text
