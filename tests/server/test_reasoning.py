"""A reasoning model's ``<think>...</think>`` comes back as ``reasoning_content``, apart from ``content``,
and as each other API surface returns thinking (Anthropic's ``thinking`` blocks, the Responses
API's ``reasoning`` item, Ollama's ``thinking``), through each one's official client.

The model is a tiny RANDOM Qwen2 written at test time (as in test_server_tools_auto) whose chat
template writes think tags, so ``reasoning_format = "auto"`` (the default) splits its answers.
A random model never thinks by itself: its output is steered by a ``guided_regex`` that admits a
thinking block and an answer WHOSE LETTERS THE MODEL CHOOSES. The expected split is read from
the model's raw text, which /v1/completions returns for the same rendered prompt and regex
(greedy; a ``cache_salt`` per request so both run the same full prefill), so nothing is
hard-coded and the test fails if the split, the whole message, or the stream is wrong.

The other surfaces take no ``guided_regex``: the ``steered`` fixture gives the chat request each
one translates its body into (Ollama's ``/api/generate``: its completion) the same
``guided_regex`` and a fresh ``cache_salt``, as ``_chat`` sends them, so that the same greedy
request must give the same thinking and answer everywhere.
"""

from __future__ import annotations

import re
import uuid

import anthropic
import attrs
import httpx
import ollama
import openai
import pytest
from ruvllm.chat import render_chat
from ruvllm.reasoning import Reasoning, reasoning_for
from server_helpers import API_KEY, RunningServer, start_server
from test_server_tools_auto import write_tiny_chat_model

#: After Qwen3's template: earlier answers are rendered without their thinking, and a new turn
#: starts on the assistant's line (the model opens the block itself), or with an empty block
#: closed when ``chat_template_kwargs`` sets ``enable_thinking`` false.
THINK_TEMPLATE = """{%- for message in messages %}
{%- set content = message.content %}
{%- if message.role == "assistant" and "</think>" in content %}
{%- set content = content.split("</think>")[-1].lstrip("\\n") %}
{%- endif %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}
{{- '<think>\\n\\n</think>\\n\\n' }}
{%- endif %}
{%- endif %}"""
MESSAGES = [{"role": "user", "content": "What is two plus two?"}]
#: A thinking block, then an answer: the model chooses every letter.
THINK_THEN_ANSWER = r"<think>\n[a-z ]{4,24}\n</think>\n\n[A-Za-z]{2,20}"


def _counts(usage) -> dict:
    """A Responses usage without how much of the prompt the cache held (it differs per request)."""
    return usage.model_dump(exclude={"input_tokens_details"})


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory) -> RunningServer:
    model_dir = write_tiny_chat_model(tmp_path_factory.mktemp("think-model") / "tiny-qwen2-think",
                                      THINK_TEMPLATE, context=512, seed=1)
    running = start_server(backend="candle_like", model=str(model_dir), server={"max_tokens_limit": 128})
    yield running
    running.stop()


@pytest.fixture(scope="module")
def client(thinking_server):
    return openai.OpenAI(base_url=thinking_server.base_url, api_key=API_KEY, max_retries=0, timeout=120)


def _chat(client, **kw):
    return client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MESSAGES, temperature=0, max_tokens=100,
        extra_body={"guided_regex": THINK_THEN_ANSWER, "cache_salt": uuid.uuid4().hex}, **kw)


def _raw_choice(client, engine):
    """What the model writes for the same prompt tokens, unsplit, with each token's offset."""
    st = engine.info.special_tokens
    prompt = render_chat(engine.info.chat_template, MESSAGES, bos_token=st.bos_text, eos_token=st.eos_text)
    ids = engine.encode(prompt, add_special=False, parse_special=True)
    return client.completions.create(
        model=client.models.list().data[0].id, prompt=ids, temperature=0, max_tokens=100, logprobs=0,
        extra_body={"guided_regex": THINK_THEN_ANSWER, "cache_salt": uuid.uuid4().hex}).choices[0]


def _raw(client, engine) -> str:
    return _raw_choice(client, engine).text


def test_thinking_comes_back_apart_from_the_answer(thinking_server, client):
    raw = _raw(client, thinking_server.engine)
    m = re.fullmatch(r"<think>\n(.*)\n</think>\n\n(.*)", raw)
    assert m is not None, raw
    message = _chat(client).choices[0].message
    assert message.reasoning_content == m.group(1).strip()
    assert message.content == m.group(2)


def test_chat_template_kwargs_reach_the_template(thinking_server, client):
    """vLLM's ``chat_template_kwargs``: Qwen3's ``enable_thinking: false`` closes an empty thinking
    block in the prompt, so the whole answer is the answer; /tokenize counts the same prompt; the
    variables ruvllm sets cannot be replaced."""
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    auth = {"Authorization": f"Bearer {API_KEY}"}
    model = client.models.list().data[0].id
    answer = client.chat.completions.create(
        model=model, messages=MESSAGES, temperature=0, max_tokens=20,
        extra_body={**off, "guided_regex": "[A-Za-z]{2,20}", "cache_salt": uuid.uuid4().hex})
    message = answer.choices[0].message
    assert message.content and message.model_dump().get("reasoning_content") is None
    counts = [httpx.post(thinking_server.url + "/tokenize", json={"messages": MESSAGES, **kwargs},
                         headers=auth).json()["count"] for kwargs in ({}, off)]
    assert counts[1] == answer.usage.prompt_tokens > counts[0]
    as_is = httpx.post(thinking_server.url + "/tokenize", json={"prompt": "Hi", **off}, headers=auth)
    assert as_is.status_code == 400 and as_is.json()["error"]["param"] == "chat_template_kwargs"
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model, messages=MESSAGES, max_tokens=2,
                                       extra_body={"chat_template_kwargs": {"messages": []}})
    assert err.value.body["param"] == "chat_template_kwargs.messages"


def test_streamed_thinking_and_answer_add_up_to_the_whole(client):
    whole = _chat(client).choices[0].message
    thinking, content, order = "", "", []
    for chunk in _chat(client, stream=True):
        for c in chunk.choices:
            delta = c.delta.model_dump()
            if delta.get("reasoning_content"):
                thinking += delta["reasoning_content"]
                order.append("thinking")
            if delta.get("content"):
                content += delta["content"]
                order.append("answer")
    assert thinking == whole.reasoning_content and content == whole.content
    assert "<think>" not in content and "</think>" not in thinking
    assert order == sorted(order, key=["thinking", "answer"].index)  # all thinking, then the answer


def test_which_models_are_split() -> None:
    think_template = "{{ '<think>' }}...{{ '</think>' }}"
    assert reasoning_for("auto", think_template, "<|im_start|>assistant\n") == Reasoning(opened=False)
    assert reasoning_for("auto", think_template, "<|im_start|>assistant\n<think>\n") == Reasoning(opened=True)
    assert reasoning_for("auto", "{{ messages }}", "x") is None  # SmolLM2's kind: no tags, all answer
    assert reasoning_for("none", think_template, "x") is None
    assert reasoning_for("deepseek", None, "x") == Reasoning(opened=False)


# --- the other API surfaces ---------------------------------------------------------------------

MAX_TOKENS = 100  # as _chat: the regex's longest answer fits, so every surface runs it whole


@pytest.fixture
def steered(monkeypatch):
    """Every surface's request steered as ``_chat`` steers chat completions."""
    from ruvllm.guided.grammar import from_extensions
    from ruvllm.server.anthropic import messages_api
    from ruvllm.server.lifecycle import chat_run, completion_run
    from ruvllm.server.lifecycle.completion_service import CompletionService
    from ruvllm.server.ollama import ollama_api
    from ruvllm.server.openai import responses_api

    regex = from_extensions(guided_regex=THINK_THEN_ANSWER)
    start_chat, start_completion = chat_run.start_chat, completion_run.start_completion

    async def steered_start(route, chat, limits, **kw):
        return await start_chat(route, attrs.evolve(chat, grammar=regex, cache_salt=uuid.uuid4().hex),
                                limits, **kw)

    for module in (messages_api, responses_api, ollama_api):
        monkeypatch.setattr(module, "start_chat", steered_start)

    # /api/generate runs a completion (completion_run's): the regex on it, and a salt on its submission.
    async def steered_completion(route, request, prompts, limits, **kw):
        return await start_completion(route, attrs.evolve(request, grammar=regex), prompts, limits, **kw)

    monkeypatch.setattr(ollama_api, "start_completion", steered_completion)
    submit = CompletionService.submit

    async def salted_submit(self, choices, **kw):
        return await submit(self, choices, **{**kw, "cache_salt": kw.get("cache_salt") or uuid.uuid4().hex})

    monkeypatch.setattr(CompletionService, "submit", salted_submit)


@pytest.fixture(scope="module")
def expected(client):
    """The chat completion's split of the steered greedy answer."""
    message = _chat(client).choices[0].message
    assert message.reasoning_content and message.content
    return message


@pytest.fixture(scope="module")
def claude(thinking_server):
    return anthropic.Anthropic(base_url=thinking_server.url, api_key=API_KEY, max_retries=0, timeout=120)


def _message(claude, client, **kw):
    return claude.messages.create(model=client.models.list().data[0].id, max_tokens=MAX_TOKENS,
                                  messages=MESSAGES, extra_body={"temperature": 0}, **kw)


def test_anthropic_thinking_blocks(steered, claude, client, expected):
    message = _message(claude, client)
    assert [b.type for b in message.content] == ["thinking", "text"]
    assert message.content[0].thinking == expected.reasoning_content and message.content[0].signature == ""
    assert message.content[1].text == expected.content
    # A budget that cannot bind is accepted; disabled drops the thinking (the model still thinks).
    budgeted = _message(claude, client, thinking={"type": "enabled", "budget_tokens": MAX_TOKENS})
    assert budgeted.content == message.content
    disabled = _message(claude, client, thinking={"type": "disabled"})
    assert [(b.type, b.text) for b in disabled.content] == [("text", expected.content)]
    assert disabled.usage.output_tokens == message.usage.output_tokens


def _blocks(message) -> list[dict]:
    return [b.model_dump(include={"type", "thinking", "signature", "text"}) for b in message.content]


def test_anthropic_streamed_thinking_adds_up(steered, claude, client, expected):
    starts, deltas = [], {"thinking_delta": "", "text_delta": "", "signature_delta": ""}
    with claude.messages.stream(model=client.models.list().data[0].id, max_tokens=MAX_TOKENS,
                                messages=MESSAGES, extra_body={"temperature": 0}) as stream:
        for event in stream:
            if event.type == "content_block_start":
                starts.append(event.content_block.type)
            elif event.type == "content_block_delta":
                delta = event.delta
                deltas[delta.type] += getattr(delta, {"thinking_delta": "thinking", "text_delta": "text",
                                                      "signature_delta": "signature"}[delta.type])
        final = stream.get_final_message()
    assert starts == ["thinking", "text"]
    assert deltas == {"thinking_delta": expected.reasoning_content, "text_delta": expected.content,
                      "signature_delta": ""}
    assert _blocks(final) == _blocks(_message(claude, client))


def test_anthropic_thinking_requests_a_thinking_model_cannot_honour(claude, client):
    with pytest.raises(anthropic.BadRequestError) as err:
        _message(claude, client, thinking={"type": "enabled", "budget_tokens": MAX_TOKENS - 1})
    assert err.value.body["error"]["message"].startswith("thinking.budget_tokens"), err.value.body
    with pytest.raises(anthropic.BadRequestError) as err:
        _message(claude, client, thinking={"type": "adaptive", "budget_tokens": MAX_TOKENS})
    assert err.value.body["error"]["message"].startswith("thinking.budget_tokens"), err.value.body


def test_anthropic_earlier_thinking_is_dropped(claude, client):
    model = client.models.list().data[0].id
    said = {"type": "text", "text": "Four."}
    thought = {"type": "thinking", "thinking": "two and two", "signature": ""}
    turns = ([said], [thought, {"type": "redacted_thinking", "data": "x"}, said])
    counts = [claude.messages.count_tokens(model=model, messages=[
        *MESSAGES, {"role": "assistant", "content": turn}, *MESSAGES]).input_tokens for turn in turns]
    assert counts[0] == counts[1]


def _responses(client, **kw):
    return client.responses.create(model=client.models.list().data[0].id, input=MESSAGES,
                                   max_output_tokens=MAX_TOKENS, temperature=0, **kw)


def _reasoning_tokens(client, engine) -> int:
    """The tokens the model wrote before its answer began, read off the raw text's offsets."""
    raw = _raw_choice(client, engine)
    answer_at = raw.text.index("</think>") + len("</think>\n\n")
    offsets = raw.logprobs.text_offset
    ends = [*offsets[1:], len(raw.text)]
    return sum(end <= answer_at for end in ends)


def test_responses_reasoning_item(steered, thinking_server, client, expected):
    response = _responses(client)
    assert [o.type for o in response.output] == ["reasoning", "message"]
    reasoning = response.output[0]
    assert reasoning.id.startswith("rs_") and reasoning.summary == []
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", expected.reasoning_content)]
    assert response.output_text == expected.content
    assert response.usage.output_tokens_details.reasoning_tokens == \
        _reasoning_tokens(client, thinking_server.engine)
    # effort none leaves the reasoning out of the answer; replayed reasoning items are dropped.
    plain = _responses(client, reasoning={"effort": "none"})
    assert [o.type for o in plain.output] == ["message"] and plain.output_text == expected.content
    assert _counts(plain.usage) == _counts(response.usage)


def _items(response) -> list[tuple]:
    return [(o.type, o.status, [(c.type, c.text) for c in o.content]) for o in response.output]


def test_responses_streamed_reasoning_adds_up(steered, client, expected):
    kinds, thinking, text = [], "", ""
    with client.responses.stream(model=client.models.list().data[0].id, input=MESSAGES,
                                 max_output_tokens=MAX_TOKENS, temperature=0) as events:
        for event in events:
            kinds.append(event.type)
            if event.type == "response.reasoning_text.delta":
                assert event.output_index == 0 and event.item_id.startswith("rs_")
                thinking += event.delta
            elif event.type == "response.output_text.delta":
                assert event.output_index == 1
                text += event.delta
        final = events.get_final_response()
    assert (thinking, text) == (expected.reasoning_content, expected.content)
    deltas = {"response.reasoning_text.delta", "response.output_text.delta"}
    order = [k for i, k in enumerate(kinds) if k not in deltas or kinds[i - 1] != k]
    assert order == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"]
    whole = _responses(client)
    assert _items(final) == _items(whole)
    assert _counts(final.usage) == _counts(whole.usage)


def test_responses_reasoning_requests_a_thinking_model_cannot_honour(client):
    for reasoning, param in (({"effort": "high"}, "reasoning.effort"),
                             ({"summary": "auto"}, "reasoning.summary")):
        with pytest.raises(openai.BadRequestError) as err:
            _responses(client, reasoning=reasoning)
        assert err.value.body["param"] == param, err.value.body


def test_responses_earlier_reasoning_is_dropped(steered, client, expected):
    replayed = [*MESSAGES, {"type": "reasoning", "id": "rs_1", "summary": [],
                            "content": [{"type": "reasoning_text", "text": "two and two"}]},
                {"role": "assistant", "content": "Four."}, *MESSAGES]
    plain = [*MESSAGES, {"role": "assistant", "content": "Four."}, *MESSAGES]
    answers = [_responses_input(client, items) for items in (plain, replayed)]
    assert answers[0] == answers[1]


def _responses_input(client, items):
    response = client.responses.create(model=client.models.list().data[0].id, input=items,
                                       max_output_tokens=MAX_TOKENS, temperature=0)
    return [o.model_dump(exclude={"id"}) for o in response.output], response.usage


@pytest.fixture(scope="module")
def llama(thinking_server):
    return ollama.Client(host=thinking_server.url, headers={"Authorization": f"Bearer {API_KEY}"},
                         timeout=120)


def _ollama(llama, kind: str, **kw):
    model = llama.list().models[0].model
    ask = {"messages": MESSAGES} if kind == "chat" else {"prompt": MESSAGES[0]["content"]}
    options = {"temperature": 0, "num_predict": MAX_TOKENS}
    return getattr(llama, kind)(model=model, options=options, **ask, **kw)


@pytest.mark.parametrize("kind", ["chat", "generate"])
def test_ollama_thinking(steered, llama, expected, kind):
    def split(part) -> tuple[str | None, str]:
        said = part.message if kind == "chat" else part
        return (said.thinking, said.content if kind == "chat" else said.response)

    assert split(_ollama(llama, kind, think=True)) == (expected.reasoning_content, expected.content)
    assert split(_ollama(llama, kind, think=False)) == (None, expected.content)
    parts = [split(p) for p in _ollama(llama, kind, stream=True)]  # think left out: as true
    assert ("".join(t or "" for t, _ in parts), "".join(a for _, a in parts)) == \
        (expected.reasoning_content, expected.content)
    kinds = ["thinking" if t else "answer" for t, a in parts if t or a]
    assert kinds == sorted(kinds, key=["thinking", "answer"].index)
