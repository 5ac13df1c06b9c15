"""The official ``openai`` client against ``ruvllm serve``'s app on the embedded model."""

from __future__ import annotations

import uuid

import httpx
import openai
import pytest
from server_helpers import API_KEY, start_server

CHAT = [{"role": "user", "content": "Name three colours."}]


def test_models_and_health(client, server, model_name):
    models = client.models.list().data
    assert [m.id for m in models] == [model_name]
    # Liveness for anyone, and nothing else: no key, or a wrong one, learns nothing of the model.
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        bare = httpx.get(server.url + "/health", headers=headers)
        assert bare.status_code == 200 and bare.json() == {"status": "ok"}
    health = httpx.get(server.url + "/health", headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert health["status"] == "ok" and health["backend"] == "llamacpp" and health["model"] == model_name
    assert health["models"] == {model_name: {"state": "loaded",
                                             "max_request_tokens": server.engine.info.context_length}}
    # What the server runs on: ISA features decide dtype auto and numerics, so operators see them.
    assert {"features", "native_bf16", "usable_cores", "memory_bytes"} <= set(health["machine"])
    assert httpx.get(server.url + "/health", headers={"X-API-Key": API_KEY}).json() == health


def test_health_details_without_a_key_when_the_server_has_none():
    """No API key configured: everyone sees the details, as before the split; max_request_tokens
    is what one request may use, so the server's --max-context caps it."""
    running = start_server(api_key=None, max_context=256)
    try:
        health = httpx.get(running.url + "/health").json()
    finally:
        running.stop()
    assert health["backend"] == "llamacpp" and "machine" in health
    assert health["models"] == {health["model"]: {"state": "loaded", "max_request_tokens": 256}}


def test_chat_completion_counts_real_tokens(client, server, model_name):
    resp = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=8, temperature=0)
    choice = resp.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason in ("stop", "length")
    tok = httpx.post(server.url + "/tokenize", json={"messages": CHAT},
                     headers={"Authorization": f"Bearer {API_KEY}"}).json()
    assert resp.usage.prompt_tokens == tok["count"]
    assert 1 <= resp.usage.completion_tokens <= 8
    assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens
    again = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=8, temperature=0)
    assert again.choices[0].message.content == choice.message.content  # greedy is deterministic


def test_cached_tokens_are_the_prompt_read_from_the_prefix_cache(client, model_name):
    """A prompt never seen before is computed but for the template's head other chats left in
    the cache; the same prompt again reads all of it but its last token from the prefix cache (as
    llama-server's token-level cache: the finished request's KV is kept past its last whole
    block), and usage says so (OpenAI's ``cached_tokens``), streamed or not, on chat, completions
    and the Responses API."""
    fresh = [{"role": "user", "content": f"({uuid.uuid4().hex}) " + "Name a colour. " * 8}]
    first = client.chat.completions.create(model=model_name, messages=fresh, max_tokens=2, temperature=0)
    again = client.chat.completions.create(model=model_name, messages=fresh, max_tokens=2, temperature=0)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens_details.cached_tokens < cached == again.usage.prompt_tokens - 1
    streamed = next(c.usage for c in client.chat.completions.create(
        model=model_name, messages=fresh, max_tokens=2, temperature=0, stream=True,
        stream_options={"include_usage": True}) if c.usage is not None)
    assert streamed.prompt_tokens_details.cached_tokens == again.usage.prompt_tokens_details.cached_tokens
    # Long enough to fill whole KV blocks, which is what the prefix cache keeps.
    counting = f"({uuid.uuid4().hex}) " + "One, two, three, " * 12
    client.completions.create(model=model_name, prompt=counting, max_tokens=1)
    warm = client.completions.create(model=model_name, prompt=counting, max_tokens=1).usage
    assert warm.prompt_tokens_details.cached_tokens == warm.prompt_tokens - 1
    answer = client.responses.create(model=model_name, input=fresh[0]["content"], max_output_tokens=4)
    assert 0 < answer.usage.input_tokens_details.cached_tokens < answer.usage.input_tokens


def test_a_developer_turn_is_the_system_turn(client, server, model_name):
    """OpenAI's newer clients send instructions as ``developer``; chat templates know ``system``."""
    said = {"system": "Answer in French.", "user": "Name a colour."}
    as_system = [{"role": role, "content": text} for role, text in said.items()]
    as_developer = [{"role": "developer", "content": said["system"]}, as_system[1]]
    tokens = [httpx.post(server.url + "/tokenize", json={"messages": messages},
                         headers={"Authorization": f"Bearer {API_KEY}"}).json()["tokens"]
              for messages in (as_system, as_developer)]
    assert tokens[0] == tokens[1] and len(tokens[0]) > 10
    # Warm first: a prefix-cache hit can round a greedy token differently from a cold prefill.
    client.chat.completions.create(model=model_name, messages=as_system, max_tokens=1, temperature=0)
    answers = [client.chat.completions.create(model=model_name, messages=messages, max_tokens=8,
                                              temperature=0)
               for messages in (as_system, as_developer)]
    assert answers[0].choices[0].message.content == answers[1].choices[0].message.content
    assert answers[1].usage.prompt_tokens == len(tokens[1])


def test_min_tokens_goes_on_past_the_end(client, model_name):
    """vLLM's min_tokens: the same greedy reply, then more where it ended before."""
    ask = dict(model=model_name, messages=[{"role": "user", "content": "What is 2+2?"}], temperature=0)
    client.chat.completions.create(**ask, max_tokens=1)  # warm: a cached prefix can round differently
    short = client.chat.completions.create(**ask, max_tokens=48)
    assert short.choices[0].finish_reason == "stop", short
    at_least = short.usage.completion_tokens + 4
    longer = client.chat.completions.create(**ask, max_tokens=48, extra_body={"min_tokens": at_least})
    assert longer.usage.completion_tokens >= at_least
    assert longer.choices[0].message.content.startswith(short.choices[0].message.content)
    with pytest.raises(openai.BadRequestError, match="at most max_tokens"):
        client.chat.completions.create(**ask, max_tokens=4, extra_body={"min_tokens": 5})


def test_special_tokens_and_what_stopped_the_answer_are_text_when_asked(client, model_name):
    """vLLM's skip_special_tokens: false and include_stop_str_in_output: true."""
    ask = dict(model=model_name, messages=[{"role": "user", "content": "Hi"}], temperature=0)
    client.chat.completions.create(**ask, max_tokens=1)  # warm: a cached prefix can round differently
    plain = client.chat.completions.create(**ask, max_tokens=32)
    assert plain.choices[0].finish_reason == "stop", plain
    shown = client.chat.completions.create(**ask, max_tokens=32, extra_body={
        "skip_special_tokens": False, "include_stop_str_in_output": True})
    assert shown.choices[0].message.content == plain.choices[0].message.content + "<|im_end|>"
    counting = dict(model=model_name, prompt="1, 2, 3,", max_tokens=12, temperature=0, stop=[" 5"])
    cut, kept = (client.completions.create(**counting, extra_body={"include_stop_str_in_output": keep})
                 for keep in (False, True))
    assert cut.choices[0].finish_reason == kept.choices[0].finish_reason == "stop"
    assert kept.choices[0].text == cut.choices[0].text + " 5"


def test_the_one_tier_and_text_are_what_a_client_may_ask_for(client, model_name):
    """OpenAI's ``service_tier`` (auto / default) and ``modalities`` (["text"]) describe what this
    server does anyway: the answer is the one without them; another tier or an audio answer is a
    400 naming the field."""
    ask = dict(model=model_name, messages=CHAT, max_tokens=6, temperature=0)
    client.chat.completions.create(**ask)  # warm: a cached prefix can round differently
    plain = client.chat.completions.create(**ask).choices[0].message.content
    for tier in ("auto", "default"):
        said = client.chat.completions.create(**ask, service_tier=tier, modalities=["text"])
        assert said.choices[0].message.content == plain
    for field, value in (("service_tier", "flex"), ("modalities", ["text", "audio"])):
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(**ask, **{field: value})
        assert err.value.body["param"] == field


def test_completion_stop_string_and_max_tokens(client, model_name):
    full = client.completions.create(model=model_name, prompt="The capital of France is",
                                     max_tokens=8, temperature=0)
    assert full.choices[0].finish_reason == "length" and full.usage.completion_tokens == 8
    text = full.choices[0].text
    assert "." in text, text
    cut = client.completions.create(model=model_name, prompt="The capital of France is",
                                    max_tokens=8, temperature=0, stop=["."])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(".")]
    one = client.completions.create(model=model_name, prompt="The capital of France is",
                                    max_tokens=8, temperature=0, stop=".")
    assert one.choices[0].text == cut.choices[0].text


def test_streaming_chat_matches_non_streaming_and_reports_usage(client, model_name):
    ref = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=10, temperature=0)
    stream = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    parts, finish, usage = [], None, None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(parts) == ref.choices[0].message.content
    assert finish == ref.choices[0].finish_reason
    assert usage is not None and usage.completion_tokens == ref.usage.completion_tokens
    assert usage.prompt_tokens == ref.usage.prompt_tokens


def test_streaming_completion_without_usage(client, model_name):
    chunks = list(client.completions.create(model=model_name, prompt="One, two,", max_tokens=6,
                                            temperature=0, stream=True))
    assert all(c.usage is None for c in chunks)
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(c.choices[0].text for c in chunks)
    ref = client.completions.create(model=model_name, prompt="One, two,", max_tokens=6, temperature=0)
    assert text == ref.choices[0].text


def test_n_choices_are_separate_requests(client, model_name):
    resp = client.completions.create(model=model_name, prompt="My favourite animal is", max_tokens=8,
                                     temperature=1.0, seed=7, n=3)
    assert sorted(c.index for c in resp.choices) == [0, 1, 2]
    assert resp.usage.completion_tokens == sum(
        (len(c.text) > 0 and 8) or 0 for c in resp.choices if c.finish_reason == "length"
    ) + sum(0 for c in resp.choices if c.finish_reason == "stop") or resp.usage.completion_tokens > 0
    texts = [c.text for c in resp.choices]
    assert len(set(texts)) > 1, texts  # each choice is sampled with its own seed (seed + index)


def test_chat_logprobs(client, model_name):
    resp = client.chat.completions.create(model=model_name, messages=CHAT, max_tokens=5, temperature=0,
                                          logprobs=True, top_logprobs=3)
    content = resp.choices[0].logprobs.content
    assert len(content) == resp.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0.0
        assert len(entry.top_logprobs) == 3
        # Greedy: the chosen token is the most likely one.
        assert entry.logprob >= max(t.logprob for t in entry.top_logprobs) - 1e-4


def test_completion_logprobs_legacy_shape(client, model_name):
    resp = client.completions.create(model=model_name, prompt="Hello", max_tokens=4, temperature=0,
                                     logprobs=2)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    assert all(len(t) <= 2 for t in lp.top_logprobs)


@pytest.mark.parametrize(("kwargs", "param"), [
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 100000}, "max_tokens"),
    ({"temperature": 5.0}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"n": 99}, "n"),
    ({"logit_bias": {"5": 101.0}}, "logit_bias[5]"),
    ({"logit_bias": {"999999": 1.0}}, "logit_bias"),
    ({"extra_body": {"prompt_logprobs": -1}}, "prompt_logprobs"),
    ({"extra_body": {"top_k": -1}}, "top_k"),
])
def test_bad_parameters_are_400_naming_the_field(client, model_name, kwargs, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_name, prompt="hi", **kwargs)
    assert err.value.status_code == 400
    assert err.value.body["param"] == param, err.value.body


def test_schema_errors_are_400_not_422(client, server):
    r = httpx.post(server.base_url + "/chat/completions", json={"messages": "hello"},
                   headers={"Authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "messages"
    r = httpx.post(server.base_url + "/completions", content=b"{not json",
                   headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    assert r.status_code == 400


def test_context_length_exceeded(client, model_name):
    """The one refusal a long request meets: longer than the model's context, named."""
    context = client.models.list().data[0].model_extra.get("max_model_len")
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_name, prompt="word " * 8300, max_tokens=10)
    assert err.value.body["code"] == "context_length_exceeded"
    assert str(context) in err.value.body["message"], (context, err.value.body["message"])


def test_a_chat_too_long_names_its_messages(client, model_name):
    """A chat's prompt is its messages rendered: the field its client sent is messages."""
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_name, max_tokens=10,
                                       messages=[{"role": "user", "content": "word " * 8300}])
    body = err.value.body
    assert body["code"] == "context_length_exceeded" and body["param"] == "messages", body
    assert body["message"].startswith("messages: the prompt has "), body


def test_a_prompt_of_a_thousand_tokens_is_answered(client, model_name):
    """The default server answers prompts far past the 512-token slices it once gave each request
    (a 964-token prompt was a 400): one request may use the model's whole context."""
    prompt = " ".join(f"Note {i}: the river bends twice before the old stone bridge." for i in range(70))
    reply = client.completions.create(model=model_name, prompt=prompt, max_tokens=8)
    assert reply.usage.prompt_tokens > 964 and reply.choices[0].finish_reason in ("length", "stop")


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="no-such-model", messages=CHAT, max_tokens=2)
    assert err.value.status_code == 404


def test_bad_api_key_is_401(server, model_name):
    bad = openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=model_name, messages=CHAT, max_tokens=2)
    assert httpx.get(server.url + "/health").status_code == 200  # probes need no key


def test_body_too_large_is_413(server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    big = {"prompt": "x" * (70 * 1024), "max_tokens": 1}
    r = httpx.post(server.base_url + "/completions", json=big, headers=headers)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"

    def chunked():  # no Content-Length: the limit is enforced while reading
        yield b'{"prompt": "'
        for _ in range(80):
            yield b"x" * 1024
        yield b'", "max_tokens": 1}'

    r = httpx.post(server.base_url + "/completions", content=chunked(),
                   headers={**headers, "Content-Type": "application/json"})
    assert r.status_code == 413


def test_tokenize_detokenize_round_trip(server):
    headers = {"Authorization": f"Bearer {API_KEY}"}
    tok = httpx.post(server.url + "/tokenize", json={"prompt": "Hello world"}, headers=headers).json()
    assert tok["count"] == len(tok["tokens"]) > 0
    text = httpx.post(server.url + "/detokenize", json={"tokens": tok["tokens"]}, headers=headers).json()
    assert text["prompt"].endswith("Hello world")
    r = httpx.post(server.url + "/detokenize", json={"tokens": [10**9]}, headers=headers)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tokens"


@pytest.mark.parametrize("encoding", ["json-escape", "raw-bytes"])
def test_lone_surrogate_is_400_naming_the_field(server, model_name, encoding):
    """``"ab \\ud800"`` (legal JSON, not Unicode) and the raw bytes ED A0 80 (not UTF-8) are client
    errors on every text endpoint, not a 500 from the tokenizer."""
    headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"}
    bad = '"ab \\ud800"' if encoding == "json-escape" else b'"ab \xed\xa0\x80"'.decode("latin-1")
    cases = [
        ("/v1/completions", '{"model": "%s", "prompt": %s, "max_tokens": 2}', "prompt"),
        ("/v1/chat/completions",
         '{"model": "%s", "messages": [{"role": "user", "content": %s}], "max_tokens": 2}',
         "messages"),
        ("/tokenize", '{"model": "%s", "prompt": %s}', "prompt"),
    ]
    for path, template, field in cases:
        body = (template % (model_name, bad)).encode("latin-1" if encoding == "raw-bytes" else "utf-8")
        r = httpx.post(server.url + path, content=body, headers=headers)
        assert r.status_code == 400, (path, r.status_code, r.text)
        error = r.json()["error"]
        assert error["param"].startswith(field) or field in error["message"], (path, error)
    assert httpx.get(server.url + "/health").status_code == 200
