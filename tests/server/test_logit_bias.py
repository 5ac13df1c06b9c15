"""``logit_bias`` on /v1/completions and /v1/chat/completions, applied by core's sampler."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.sampling import Sampler
from ruvllm.types import GenerationParams
from server_helpers import API_KEY

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


def test_sampler_adds_the_bias_before_choosing_and_reports_the_models_logprobs():
    logits = np.array([2.0, 1.0, 0.0, -1.0], dtype=np.float32)
    params = GenerationParams(logit_bias={"3": 10.0, 0: -100}, logprobs=1)
    token = Sampler(params, vocab_size=4).sample(logits)
    assert token.token_id == 3
    expected = logits - np.log(np.exp(logits).sum())
    assert token.logprob == pytest.approx(float(expected[3]))
    assert token.top_logprobs[0][0] == 0  # the unbiased model's best token


@pytest.mark.parametrize("bias", [{"1": 100.5}, {"-1": 1.0}, {"x": 1.0}, {"1": float("nan")}])
def test_params_refuse_bad_bias(bias):
    with pytest.raises(InvalidRequest) as err:
        GenerationParams(logit_bias=bias)
    assert err.value.field == "logit_bias"


def _greedy(server, path: str, body: dict) -> dict:
    r = httpx.post(server.url + path, headers=HEADERS, timeout=120,
                   json={"temperature": 0, "max_tokens": 3, **body})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def test_bias_forces_and_forbids_tokens_on_both_endpoints(server):
    engine = server.engine
    forced = engine.encode(" banana", add_special=False)[0]
    plain = _greedy(server, "/v1/completions", {"prompt": "One, two,", "logprobs": 0})
    first = engine.encode(plain["text"], add_special=False)[0]
    assert first != forced
    # +100 makes ` banana` every token; the reported logprob is still the model's (far below 0).
    out = _greedy(server, "/v1/completions", {"prompt": "One, two,", "logprobs": 0,
                                              "logit_bias": {str(forced): 100}})
    assert out["logprobs"]["tokens"] == [engine.tokenizer.token_text(forced)] * 3
    assert out["logprobs"]["token_logprobs"][0] < -1.0
    # -100 on the greedy first token makes the model choose another one.
    out = _greedy(server, "/v1/completions", {"prompt": "One, two,", "logit_bias": {str(first): -100}})
    assert engine.encode(out["text"], add_special=False)[0] != first
    chat = _greedy(server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                    "logit_bias": {str(forced): 100}})
    assert chat["message"]["content"] == engine.tokenizer.decode([forced] * 3)


def test_bias_outside_the_vocabulary_is_400_naming_logit_bias(server):
    vocab = server.engine.tokenizer.vocab_size
    r = httpx.post(server.url + "/v1/completions", headers=HEADERS, timeout=60,
                   json={"prompt": "hi", "max_tokens": 1, "logit_bias": {str(vocab): 1.0}})
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["param"] == "logit_bias" and str(vocab) in err["message"]
