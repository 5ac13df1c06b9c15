"""``/v1/completions`` with ``stream: true`` and ``echo: true``: the prompt's chunk comes first.

OpenAI and vLLM send the echoed prompt before the generated text. Checked on the real server
(llamacpp, embedded SmolLM2) through raw SSE, so the order and shape of every chunk is seen,
and through the official ``openai`` client. With ``logprobs`` the prompt's chunk carries the
prompt's logprobs, compared with the same request answered whole (prompt-logprob requests never
reuse cached KV, so both run the same prefill; values compared with a small tolerance).
"""

from __future__ import annotations

import json

import httpx
import pytest
from server_helpers import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
PROMPTS = ["The capital of France is", "One, two, three,"]


def stream_chunks(server, body: dict) -> list[dict]:
    """Every ``data:`` payload of a streamed completion, up to ``[DONE]`` (which must come)."""
    chunks = []
    with httpx.stream("POST", server.url + "/v1/completions", json={**body, "stream": True},
                      headers=HEADERS, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            if line == "data: [DONE]":
                return chunks
            chunks.append(json.loads(line[len("data: "):]))
    raise AssertionError("the stream ended without [DONE]")


def by_choice(chunks: list[dict]) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for chunk in chunks:
        for c in chunk["choices"]:
            out.setdefault(c["index"], []).append(c)
    return out


def test_echo_streams_the_prompt_first_then_the_tokens(server, model_name):
    body = {"model": model_name, "prompt": PROMPTS, "n": 2, "echo": True, "max_tokens": 6,
            "ignore_eos": True, "temperature": 0.7, "seed": 3, "stream_options": {"include_usage": True}}
    chunks = stream_chunks(server, body)
    choices = by_choice(chunks)
    assert sorted(choices) == [0, 1, 2, 3]
    for index, parts in choices.items():
        prompt = PROMPTS[index // 2]
        assert parts[0]["text"] == prompt and parts[0]["finish_reason"] is None
        assert all(p["text"] != prompt for p in parts[1:])  # the prompt is sent once
        assert parts[-1]["finish_reason"] == "length"
        assert len("".join(p["text"] for p in parts)) > len(prompt)
    usage = chunks[-1]["usage"]
    assert chunks[-1]["choices"] == [] and usage["completion_tokens"] == 4 * 6


def test_echo_with_logprobs_sends_the_prompts_logprobs_first(server, model_name):
    base = {"model": model_name, "prompt": PROMPTS[0], "echo": True, "logprobs": 2, "max_tokens": 3,
            "ignore_eos": True, "temperature": 0}
    whole = httpx.post(server.url + "/v1/completions", json=base, headers=HEADERS, timeout=120).json()
    ref = whole["choices"][0]["logprobs"]
    n_prompt = whole["usage"]["prompt_tokens"]
    (parts,) = by_choice(stream_chunks(server, base)).values()
    first = parts[0]
    assert first["text"] == PROMPTS[0]
    lp = first["logprobs"]
    assert lp["tokens"] == ref["tokens"][:n_prompt] and lp["text_offset"] == ref["text_offset"][:n_prompt]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["token_logprobs"][1:] == pytest.approx(ref["token_logprobs"][1:n_prompt], abs=2e-3)
    assert all(len(top) == 2 for top in lp["top_logprobs"][1:])
    generated = [p for p in parts[1:] if p["logprobs"] and p["logprobs"]["tokens"]]
    assert len(generated) == 3
    offsets = [p["logprobs"]["text_offset"][0] for p in generated]
    assert offsets[0] == len(PROMPTS[0]) and offsets == sorted(offsets)
    assert parts[-1]["finish_reason"] == "length"


def test_echo_only_streams_the_prompt_and_counts_no_completion_tokens(server, model_name):
    body = {"model": model_name, "prompt": PROMPTS[1], "echo": True, "logprobs": 0, "max_tokens": 0,
            "stream_options": {"include_usage": True}}
    chunks = stream_chunks(server, body)
    (parts,) = by_choice(chunks).values()
    assert [p["text"] for p in parts] == [PROMPTS[1], ""]
    assert parts[-1]["finish_reason"] == "length"
    n_prompt = chunks[-1]["usage"]["prompt_tokens"]
    assert len(parts[0]["logprobs"]["tokens"]) == n_prompt
    assert chunks[-1]["usage"]["completion_tokens"] == 0


def test_openai_client_reads_a_streamed_echo(client, model_name):
    text = ""
    for chunk in client.completions.create(model=model_name, prompt=PROMPTS[0], echo=True, stream=True,
                                           max_tokens=4, temperature=0):
        text += chunk.choices[0].text
    assert text.startswith(PROMPTS[0]) and len(text) > len(PROMPTS[0])
