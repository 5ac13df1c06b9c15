"""``echo`` + ``logprobs`` on /v1/completions: prompt logprobs from the executor's prefill logits.

Checked against the backend's own logits computed in-process: the logprob of prompt token
``p`` is what the engine's sampler reports when the prefix ``prompt[:p]`` is run and token
``p`` is forced by ``logit_bias`` (reported logprobs are the model's, not the biased ones).
That reference runs through the decode path, a different batch shape from the prefill rows, so
values are compared with a tolerance, not bit for bit.
"""

from __future__ import annotations

import httpx
import pytest
from ruvllm.types import GenerationParams
from server_helpers import API_KEY, RunningServer, start_server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
TEXT = "The capital of France is Paris. The capital of Italy is"


@pytest.fixture(scope="module", params=["llamacpp", "candle_like"])
def backend_server(request) -> RunningServer:
    running = start_server(backend=request.param, server={"max_tokens_limit": 64})
    yield running
    running.stop()


def _post(srv: RunningServer, body: dict, path: str = "/v1/completions") -> httpx.Response:
    return httpx.post(srv.url + path, json=body, headers=HEADERS, timeout=120)


def _reference(srv: RunningServer, ids: list[int]) -> list[float]:
    out = []
    for p in range(1, len(ids)):
        r = srv.engine.generate_sync(
            [ids[:p]], GenerationParams(max_tokens=1, logprobs=0, logit_bias={ids[p]: 100}))[0]
        assert r.token_ids[0] == ids[p]
        out.append(r.logprobs[0].logprob)
    return out


def test_echo_logprobs_match_in_process_logits(backend_server):
    srv = backend_server
    ids = srv.engine.encode(TEXT)
    r = _post(srv, {"prompt": ids, "echo": True, "logprobs": 2, "max_tokens": 1, "temperature": 0})
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    n = len(ids)
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n + 1
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
    assert "".join(lp["tokens"][:n]) == TEXT
    assert choice["text"].startswith(TEXT)
    ref = _reference(srv, ids)
    got = lp["token_logprobs"][1:n]
    assert got == pytest.approx(ref, abs=2e-3)
    for p in range(1, n):
        top = lp["top_logprobs"][p]
        assert len(top) == 2
        best = max(top.values())
        # The prompt token is either among the two best or less likely than both.
        assert got[p - 1] <= best + 1e-6
    # The generated token follows, with its own logprob.
    assert lp["token_logprobs"][n] is not None and lp["text_offset"][n] == len(TEXT)
    # A request for the prompt's logprobs computes the whole prompt: nothing is read from the cache.
    assert r.json()["usage"] == {"prompt_tokens": n, "completion_tokens": 1, "total_tokens": n + 1,
                                 "prompt_tokens_details": {"cached_tokens": 0}}


def test_echo_with_max_tokens_0_scores_the_prompt_only(backend_server):
    srv = backend_server
    ids = srv.engine.encode(TEXT)
    r = _post(srv, {"prompt": [ids, ids[:5]], "echo": True, "logprobs": 0, "max_tokens": 0})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["usage"]["completion_tokens"] == 0
    first, second = sorted(body["choices"], key=lambda c: c["index"])
    assert first["text"] == TEXT
    assert len(first["logprobs"]["token_logprobs"]) == len(ids)
    assert len(second["logprobs"]["token_logprobs"]) == 5
    # The shorter prompt is a prefix: its logprobs are the same positions' (prefix-cache safe).
    assert second["logprobs"]["token_logprobs"][1:] == pytest.approx(
        first["logprobs"]["token_logprobs"][1:5], abs=2e-3)
    assert first["logprobs"]["top_logprobs"][1] is None  # logprobs 0: no alternatives


def test_max_tokens_0_runs_no_decode_step(backend_server):
    """The engine scores the prompt and samples nothing: no generated token is counted, the
    result has no tokens, and the prompt's logprobs are those of a one-token request."""
    srv = backend_server
    ids = srv.engine.encode(TEXT)
    before = srv.engine.metrics().generation_tokens
    scored = srv.engine.generate_sync([ids], GenerationParams(max_tokens=0, prompt_logprobs=0))[0]
    plain = srv.engine.generate_sync([ids], GenerationParams(max_tokens=0))[0]
    assert srv.engine.metrics().generation_tokens == before
    for result in (scored, plain):
        assert result.token_ids == () and result.text == "" and result.finish_reason.value == "length"
        assert result.usage.completion_tokens == 0
    assert plain.prompt_logprobs is None
    one = srv.engine.generate_sync([ids], GenerationParams(max_tokens=1, prompt_logprobs=0))[0]
    assert scored.prompt_logprobs[0] is None and len(scored.prompt_logprobs) == len(ids)
    assert [e.logprob for e in scored.prompt_logprobs[1:]] == pytest.approx(
        [e.logprob for e in one.prompt_logprobs[1:]], abs=1e-4)
    r = _post(srv, {"prompt": TEXT, "echo": True, "max_tokens": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == TEXT and r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["usage"]["completion_tokens"] == 0
    assert srv.engine.metrics().generation_tokens == before + 1  # the one-token reference only


def test_repeated_prompt_gives_the_same_logprobs(backend_server):
    """The second request would find the prompt in the prefix cache; prompt logprobs must still
    come from a full prefill (no missing positions)."""
    srv = backend_server
    body = {"prompt": TEXT + " Rome.", "echo": True, "logprobs": 1, "max_tokens": 1, "temperature": 0}
    a = _post(srv, body).json()["choices"][0]["logprobs"]["token_logprobs"]
    b = _post(srv, body).json()["choices"][0]["logprobs"]["token_logprobs"]
    assert a[:-1] == pytest.approx(b[:-1], abs=1e-4)
    assert all(v is not None for v in a[1:])


def test_echo_logprobs_refusals(backend_server):
    srv = backend_server
    # stream + echo + logprobs is answered (tests/server/test_server_stream_echo.py).
    r = _post(srv, {"prompt": TEXT, "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = _post(srv, {"prompt": TEXT, "echo": True, "logprobs": 6, "max_tokens": 1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logprobs"


def test_tokenizer_info(backend_server):
    srv = backend_server
    r = httpx.get(srv.url + "/tokenizer_info", headers=HEADERS, timeout=30)
    assert r.status_code == 200
    info = r.json()
    st = srv.engine.info.special_tokens
    assert info["eos_token"] == st.eos_text and info["eos_token_id"] == st.eos_ids[0]
    assert info["vocab_size"] == srv.engine.tokenizer.vocab_size
    assert info["model_max_length"] == srv.engine.info.context_length
    assert info["chat_template"] == srv.engine.info.chat_template


@pytest.mark.parametrize(("params", "field"), [
    (GenerationParams(prompt_logprobs=0), "prompt_logprobs"),
    (GenerationParams(logit_bias={3: 1.0}), "logit_bias"),
])
def test_request_level_backends_refuse_with_the_reason(params, field):
    """mistral.rs-like backends run whole requests: no prefill logits, no core sampler."""
    from ruvllm.engine.prompt_logprobs import check_logits_options
    from ruvllm.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match="request") as err:
        check_logits_options(params, path="request", backend="mistralrs", vocab_size=10, executor=None)
    assert err.value.field == field
    # An executor that does not declare prefill logits is refused too.
    if field == "prompt_logprobs":
        with pytest.raises(InvalidRequest):
            check_logits_options(params, path="executor", backend="x", vocab_size=10, executor=object())
