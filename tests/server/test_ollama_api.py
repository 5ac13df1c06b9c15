"""Ollama's own API through the official ``ollama`` client, on the embedded model.

The surface is thin (server/ollama/ollama_api.py): what it must show is that a client written for
Ollama gets the same answers as an OpenAI client does from the same core, in Ollama's shapes:
the same greedy text and token counts as ``/v1/chat/completions`` and ``/v1/completions``, a
newline-delimited stream that adds up to the whole answer and ends with the engine's counts,
the token ``context`` round trip, structured output, a tool call round trip, the model listings,
embeddings, a reasoning model's ``thinking`` apart from its answer, and errors in Ollama's shape
(``{"error": ...}``) naming Ollama's fields.
"""

from __future__ import annotations

import datetime
import json
import time

import httpx
import jsonschema
import numpy as np
import ollama
import pytest
from server_helpers import API_KEY, start_server

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CONVERSATION = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Name a colour."},
    {"role": "assistant", "content": "Blue."},
    {"role": "user", "content": "And another one?"},
]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Oslo?"}]


def greedy(num_predict: int, **more) -> dict:
    return {"temperature": 0, "num_predict": num_predict, **more}


@pytest.fixture(scope="module")
def llama(server):
    return ollama.Client(host=server.url, headers=AUTH, timeout=120)


def _counts(answer) -> tuple[int, int]:
    return answer.prompt_eval_count, answer.eval_count


def _timings_are_the_engines(answer) -> None:
    assert answer.done is True and answer.load_duration >= 0
    assert answer.prompt_eval_duration > 0 and answer.eval_duration > 0
    assert answer.total_duration >= answer.prompt_eval_duration + answer.eval_duration


def test_greedy_chat_is_the_same_answer_as_chat_completions(llama, client, model_name):
    answer = llama.chat(model=model_name, messages=CONVERSATION, options=greedy(24))
    chat = client.chat.completions.create(model=model_name, messages=CONVERSATION, temperature=0,
                                          max_tokens=24)
    assert answer.model == model_name and answer.message.role == "assistant"
    assert answer.message.content == chat.choices[0].message.content
    assert answer.done_reason == chat.choices[0].finish_reason  # "stop" or "length" on both
    assert _counts(answer) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    _timings_are_the_engines(answer)


def test_a_stream_adds_up_to_the_answer_and_ends_with_the_counts(llama, model_name):
    whole = llama.chat(model=model_name, messages=CONVERSATION, options=greedy(24))
    parts = list(llama.chat(model=model_name, messages=CONVERSATION, options=greedy(24), stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == whole.message.content
    last = parts[-1]
    assert (last.done_reason, *_counts(last)) == (whole.done_reason, *_counts(whole))
    _timings_are_the_engines(last)


def test_ollama_streams_unless_told_not_to(server, model_name):
    """``stream`` defaults to true: newline-delimited JSON objects, the last one done."""
    body = {"model": model_name, "prompt": "Hello", "options": {"num_predict": 3}}
    r = httpx.post(server.url + "/api/generate", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200 and r.headers["content-type"] == "application/x-ndjson"
    objects = [json.loads(line) for line in r.text.splitlines()]
    assert [o["done"] for o in objects][-1] is True and not any(o["done"] for o in objects[:-1])
    assert objects[-1]["eval_count"] == 3 and objects[-1]["done_reason"] == "length"


def test_generate_renders_the_template_and_raw_does_not(llama, client, model_name):
    templated = llama.generate(model=model_name, system="Be brief.", prompt="Name a colour.",
                               options=greedy(12))
    chat = client.chat.completions.create(model=model_name, temperature=0, max_tokens=12,
                                          messages=[{"role": "system", "content": "Be brief."},
                                                    {"role": "user", "content": "Name a colour."}])
    assert templated.response == chat.choices[0].message.content
    assert _counts(templated) == (chat.usage.prompt_tokens, chat.usage.completion_tokens)
    raw = llama.generate(model=model_name, prompt="One, two, three,", raw=True, options=greedy(8))
    completion = client.completions.create(model=model_name, prompt="One, two, three,", temperature=0,
                                           max_tokens=8)
    assert raw.response == completion.choices[0].text and raw.context is None
    assert _counts(raw) == (completion.usage.prompt_tokens, completion.usage.completion_tokens)


def test_the_context_of_an_answer_continues_the_conversation(llama, model_name):
    """``context`` holds the prompt's and the answer's tokens; sent back, it is the start of the
    next prompt, as in Ollama."""
    first = llama.generate(model=model_name, prompt="Name a colour.", options=greedy(6))
    assert len(first.context) == first.prompt_eval_count + first.eval_count
    alone = llama.generate(model=model_name, prompt="And another one?", options=greedy(6))
    follow = llama.generate(model=model_name, prompt="And another one?", context=first.context,
                            options=greedy(6))
    assert follow.prompt_eval_count == len(first.context) + alone.prompt_eval_count
    assert follow.context[: len(first.context)] == first.context


def test_format_constrains_the_answer(llama, model_name):
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
              "required": ["colour"]}
    answer = llama.chat(model=model_name, messages=[{"role": "user", "content": "Pick a colour."}],
                        format=schema, options={"num_predict": 30, "seed": 7})
    jsonschema.validate(json.loads(answer.message.content), schema)
    generated = llama.generate(model=model_name, prompt="Pick a colour.", format=schema, options=greedy(30))
    jsonschema.validate(json.loads(generated.response), schema)
    # "json": any object (this prompt's answer alone would be prose); too short to close, so its start.
    started = llama.generate(model=model_name, prompt="Name a colour.", format="json", options=greedy(3))
    assert started.response.startswith("{"), started.response


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_tool_call_round_trip(llama, model_name, stream):
    """The model calls the tool (arguments an object that validates), and answers the tool's
    result in text (the embedded model's template renders no tools: guided/tools.py teaches it)."""
    if stream:
        parts = list(llama.chat(model=model_name, messages=ASK, tools=[WEATHER], options=greedy(60),
                                stream=True))
        calls = [c for p in parts for c in p.message.tool_calls or []]
        assert parts[-1].done and parts[-1].done_reason == "stop"
    else:
        answer = llama.chat(model=model_name, messages=ASK, tools=[WEATHER], options=greedy(60))
        calls = answer.message.tool_calls
        assert answer.done_reason == "stop" and answer.message.content == ""
    (call,) = calls
    assert call.function.name == "get_weather"
    jsonschema.validate(call.function.arguments, {**WEATHER["function"]["parameters"],
                                                  "additionalProperties": False})
    reply = llama.chat(model=model_name, tools=[WEATHER], options=greedy(40), messages=[
        *ASK, {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "sunny, 21 C", "tool_name": "get_weather"}])
    assert reply.message.content and not reply.message.tool_calls


def test_logprobs_come_with_each_token(llama, model_name):
    answer = llama.chat(model=model_name, messages=CONVERSATION, options=greedy(4), logprobs=True,
                        top_logprobs=2)
    assert len(answer.logprobs) == answer.eval_count
    first = answer.logprobs[0]
    assert first.logprob <= 0 and len(first.top_logprobs) == 2
    assert first.top_logprobs[0].logprob == pytest.approx(first.logprob)  # greedy: the likeliest


def test_num_ctx_bounds_prompt_and_answer(llama, model_name):
    """A smaller ``num_ctx`` caps the request (the answer stops when it is full); a prompt that
    does not fit is refused naming it: Ollama would cut the conversation, ruvllm never does."""
    prompt = llama.chat(model=model_name, messages=ASK, options=greedy(1)).prompt_eval_count
    capped = llama.chat(model=model_name, messages=ASK, options={"temperature": 0, "num_ctx": prompt + 5})
    assert capped.done_reason == "length" and capped.eval_count == 5
    with pytest.raises(ollama.ResponseError) as err:
        llama.chat(model=model_name, messages=ASK, options={"num_ctx": prompt - 1})
    assert err.value.status_code == 400 and err.value.error.startswith("options.num_ctx: ")


def test_repeat_last_n_is_ollamas_penalty_window(llama, model_name):
    """Penalties count the last ``repeat_last_n`` tokens (64 when left out), the prompt's too: 0
    turns them off, on chat and generate alike."""
    counting = "one two three four five six seven eight nine ten one two three four five six seven"
    for ask in (lambda **o: llama.generate(model=model_name, prompt=counting, raw=True, options=o).response,
                lambda **o: llama.chat(model=model_name, messages=[{"role": "user", "content": counting}],
                                       options=o).message.content):
        ask(**greedy(1))  # warm the prefix: every answer below reads it cached
        plain = ask(**greedy(8))
        penalised = greedy(8, repeat_penalty=1.8, frequency_penalty=0.5)
        assert ask(**penalised, repeat_last_n=0) == plain
        assert ask(**penalised, repeat_last_n=-1) != plain
        assert ask(**penalised) == ask(**penalised, repeat_last_n=64)


def test_mirostat_draws_within_its_surprise_bound(llama, model_name):
    """Ollama's mirostat 2: a tiny target surprise keeps the favourite alone (the greedy answer)
    whatever the seed, on chat and generate."""
    def generate(**options) -> str:
        return llama.generate(model=model_name, prompt="One, two, three,", raw=True, options=options).response

    bounded = {"temperature": 1.5, "num_predict": 4, "mirostat": 2, "mirostat_tau": 0.05}
    plain = generate(**greedy(4))
    assert all(generate(**bounded, seed=seed) == plain for seed in range(3))
    chat = llama.chat(model=model_name, messages=ASK, options={**bounded, "seed": 1}).message.content
    assert chat == llama.chat(model=model_name, messages=ASK, options=greedy(4)).message.content


def test_an_empty_prompt_loads_the_model(server, llama, model_name):
    for path, body in (("/api/generate", {}), ("/api/chat", {"messages": []})):
        r = httpx.post(server.url + path, json={"model": model_name, **body}, headers=AUTH, timeout=60)
        assert r.status_code == 200 and r.json()["done_reason"] == "load", r.text
    # keep_alive 0 asks for an unload: this test server's engine was handed in loaded and cannot
    # be loaded again (as a Ray replica set), so it is refused by name (a served one: below).
    with pytest.raises(ollama.ResponseError) as err:
        llama.generate(model=model_name, keep_alive=0)
    assert err.value.status_code == 400 and err.value.error.startswith("keep_alive: ")


def test_the_root_says_ollama_is_running_to_anyone(server):
    """Ollama's CLI and other clients probe ``HEAD /`` first; they send no API key."""
    assert httpx.head(server.url + "/", timeout=10).status_code == 200
    r = httpx.get(server.url + "/", timeout=10)
    assert r.status_code == 200 and r.text == "Ollama is running"


def test_pulling_a_served_model_succeeds_and_the_model_store_is_the_configurations(llama, model_name):
    """``ollama run`` and chat UIs pull before first use: a served model is here already. Other
    names, and the routes that would change Ollama's model store, are refused saying what to do."""
    assert llama.pull(model_name).status == "success"
    assert [p.status for p in llama.pull(f"{model_name}:latest", stream=True)] == ["success"]
    with pytest.raises(ollama.ResponseError) as err:
        llama.pull("llama3.2")
    assert err.value.status_code == 404
    assert model_name in err.value.error and "[[models]]" in err.value.error
    for endpoint, change in [("/api/delete", lambda: llama.delete(model_name)),
                             ("/api/copy", lambda: llama.copy(model_name, "mine")),
                             ("/api/push", lambda: llama.push(model_name)),
                             ("/api/create", lambda: llama.create(model="mine", from_=model_name))]:
        with pytest.raises(ollama.ResponseError) as err:
            change()
        assert err.value.status_code == 501 and err.value.error.startswith(f"{endpoint} is not served")
    assert model_name in [m.model.removesuffix(":latest") for m in llama.list().models]


@pytest.fixture(scope="module")
def reloadable():
    """A server whose model a request may unload and the next one loads again (ruvllm serve's)."""
    running = start_server(reloadable=True)
    yield running, ollama.Client(host=running.url, headers=AUTH, timeout=120)
    running.stop()


def _expires_in(client) -> float | None:
    """Seconds until the one loaded model unloads (None: never); raises if none is loaded."""
    (model,) = client.ps().models
    if model.expires_at is None:
        return None
    return (model.expires_at - datetime.datetime.now(datetime.timezone.utc)).total_seconds()


def test_keep_alive_holds_for_the_model_from_the_request_on(reloadable):
    running, client = reloadable
    model = running.engine.info.name
    client.generate(model=model, prompt="Hi", options=greedy(2), keep_alive="2s")
    assert 0 < _expires_in(client) <= 2.0
    deadline = time.monotonic() + 10
    while client.ps().models:  # the reaper unloads it once idle for 2 s
        assert time.monotonic() < deadline, "not unloaded within 10 s of a 2 s keep_alive"
        time.sleep(0.2)
    again = client.generate(model=model, prompt="Hi", options=greedy(2), keep_alive=-1)
    assert again.done and again.load_duration > 100_000  # ns: it was loaded again for this request
    assert _expires_in(client) is None  # negative: stays loaded
    client.generate(model=model, prompt="Hi", options=greedy(2))  # left out: the configured (never)
    assert _expires_in(client) is None
    unloaded = httpx.post(running.url + "/api/generate", json={"model": model, "keep_alive": 0}, headers=AUTH,
                          timeout=60)
    assert unloaded.status_code == 200 and unloaded.json()["done_reason"] == "unload"
    assert client.ps().models == []
    assert client.chat(model=model, messages=ASK, options=greedy(3)).eval_count == 3  # back on demand


def test_the_models_are_listed_shown_and_running(server, llama, model_name):
    (listed,) = llama.list().models
    assert listed.model == f"{model_name}:latest" and listed.size > 0 and len(listed.digest) == 64
    details = listed.details
    assert (details.format, details.family, details.quantization_level) == ("gguf", "llama", "Q4_1")
    assert details.parameter_size == "134.52M"
    shown = llama.show(listed.model)  # the tag resolves to the served model
    assert shown.details == details and "tools" in shown.capabilities and "completion" in shown.capabilities
    assert "thinking" not in shown.capabilities
    assert shown.modelinfo["llama.context_length"] == 8192 and shown.template.startswith("{%")
    (running,) = llama.ps().models
    assert running.model == listed.model and running.context_length == 8192 and running.size_vram == 0
    assert httpx.get(server.url + "/api/version", headers=AUTH).json()["version"].count(".") == 2


def test_embeddings_are_the_servers_vectors(llama, client, model_name):
    texts = ["The cat sat.", "A kitten sat."]
    embedded = llama.embed(model=model_name, input=texts)
    reference = client.embeddings.create(model=model_name, input=texts, encoding_format="float")
    assert np.allclose(embedded.embeddings, [d.embedding for d in reference.data], atol=1e-4)
    assert embedded.prompt_eval_count == reference.usage.prompt_tokens
    legacy = llama.embeddings(model=model_name, prompt=texts[0])
    assert np.allclose(legacy.embedding, embedded.embeddings[0], atol=1e-4)


def test_errors_come_in_ollamas_shape_naming_ollamas_fields(server, llama, model_name):
    def refused(status: int = 400, **body) -> str:
        with pytest.raises(ollama.ResponseError) as err:
            llama.chat(**{"model": model_name, "messages": ASK, **body})
        assert err.value.status_code == status
        return err.value.error

    assert refused(404, model="no-such-model").startswith("model 'no-such-model' not found")
    assert refused(options={"num_predict": 10_000}).startswith("options.num_predict: ")  # chat's max_tokens
    assert refused(format={"type": "frob"}).startswith("format: ")  # chat's guided_json
    long = [{"role": "user", "content": "word " * 12_000}]
    assert refused(messages=long).startswith("messages: ")  # chat's prompt
    assert refused(options={"temprature": 0.5}).startswith("options.temprature: ")
    assert refused(options={"mirostat": 3}).startswith("options.mirostat: ")
    assert refused(think=True).startswith("think: ")
    image = [{"role": "user", "content": "What is this?", "images": [b"\x89PNG\r\n"]}]
    assert refused(messages=image).startswith("messages[0].images: ")
    with pytest.raises(ollama.ResponseError) as err:
        llama.generate(model=model_name, prompt="def f(x):", suffix="    return y")
    assert err.value.error.startswith("suffix: ")
    r = httpx.post(server.url + "/api/chat", json={"model": model_name, "messages": ASK})
    assert r.status_code == 401 and set(r.json()) == {"error"}


#: A thinking template (earlier answers lose their thinking, so ``reasoning_format = "auto"``
#: splits its answers) that opens the block on the assistant's line, as DeepSeek-R1's does:
#: whatever the model writes before ``</think>`` is its thinking.
THINK_OPEN_TEMPLATE = (
    "{%- for message in messages %}{{- '<|im_start|>' + message.role + '\\n' + "
    "message.content.split('</think>')[-1] + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}")
#: What the random model writes, constrained (the letters are its own), all of it thinking.
WORD = {"type": "object", "properties": {"word": {"type": "string", "pattern": "^[a-z]{4,8}$"}},
        "required": ["word"]}


@pytest.fixture(scope="module")
def thinking_llama(tmp_path_factory):
    """A tiny RANDOM Qwen2 (candle_like) whose template opens a thinking block, on its own server:
    the embedded model has no reasoning parser."""
    from test_server_tools_auto import write_tiny_chat_model

    model_dir = write_tiny_chat_model(tmp_path_factory.mktemp("ollama-think") / "tiny-qwen2-think",
                                      THINK_OPEN_TEMPLATE, context=256, seed=1)
    running = start_server(backend="candle_like", model=str(model_dir), server={"max_tokens_limit": 64})
    yield ollama.Client(host=running.url, headers=AUTH, timeout=120)
    running.stop()


def test_a_reasoning_models_thinking_comes_apart_from_the_answer(thinking_llama):
    llama = thinking_llama
    model = llama.list().models[0].model
    assert "thinking" in llama.show(model).capabilities
    ask = {"model": model, "format": WORD, "options": greedy(40)}
    answer = llama.chat(**ask, messages=ASK, think=True)
    assert answer.message.content == "" and answer.done_reason == "stop"
    jsonschema.validate(json.loads(answer.message.thinking), WORD)
    parts = list(llama.chat(**ask, messages=ASK, stream=True))  # think left out: the same split
    assert not any(p.message.content for p in parts) and parts[-1].done
    jsonschema.validate(json.loads("".join(p.message.thinking or "" for p in parts)), WORD)
    generated = llama.generate(**ask, prompt=ASK[0]["content"])
    assert generated.response == "" and json.loads(generated.thinking)["word"]
    # false leaves the thinking out (the template decides whether the model thinks); its tokens count.
    hidden = llama.chat(**ask, messages=ASK, think=False)
    assert hidden.message.thinking is None and hidden.message.content == "" and hidden.eval_count > 0
    hidden_parts = list(llama.generate(**ask, prompt=ASK[0]["content"], think=False, stream=True))
    assert [p.done for p in hidden_parts] == [True] and hidden_parts[0].thinking is None
    with pytest.raises(ollama.ResponseError) as err:  # an effort level cannot be set
        llama.chat(**ask, messages=ASK, think="high")
    assert err.value.status_code == 400 and err.value.error.startswith("think: ")
