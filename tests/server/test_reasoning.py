"""A reasoning model's ``<think>...</think>`` comes back as ``reasoning_content``, apart from ``content``.

The model is a tiny RANDOM Qwen2 written at test time (as in test_server_tools_auto) whose chat
template writes think tags, so ``reasoning_format = "auto"`` (the default) splits its answers.
A random model never thinks by itself: its output is steered by a ``guided_regex`` that admits a
thinking block and an answer WHOSE LETTERS THE MODEL CHOOSES. The expected split is read from
the model's raw text, which /v1/completions returns for the same rendered prompt and regex
(greedy; a ``cache_salt`` per request so both run the same full prefill), so nothing is
hard-coded and the test fails if the split, the whole message, or the stream is wrong.
"""

from __future__ import annotations

import re
import uuid

import pytest
from ruvllm.chat import render_chat
from ruvllm.reasoning import Reasoning, reasoning_for
from server_helpers import API_KEY, RunningServer, start_server
from test_server_tools_auto import write_tiny_chat_model

openai = pytest.importorskip("openai")

#: After Qwen3's template: earlier answers are rendered without their thinking, and a new turn
#: starts on the assistant's line (the model opens the block itself).
THINK_TEMPLATE = """{%- for message in messages %}
{%- set content = message.content %}
{%- if message.role == "assistant" and "</think>" in content %}
{%- set content = content.split("</think>")[-1].lstrip("\\n") %}
{%- endif %}
{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""
MESSAGES = [{"role": "user", "content": "What is two plus two?"}]
#: A thinking block, then an answer: the model chooses every letter.
THINK_THEN_ANSWER = r"<think>\n[a-z ]{4,24}\n</think>\n\n[A-Za-z]{2,20}"


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


def _raw(client, engine) -> str:
    """What the model writes for the same prompt tokens, unsplit."""
    st = engine.info.special_tokens
    prompt = render_chat(engine.info.chat_template, MESSAGES, bos_token=st.bos_text, eos_token=st.eos_text)
    ids = engine.encode(prompt, add_special=False, parse_special=True)
    return client.completions.create(
        model=client.models.list().data[0].id, prompt=ids, temperature=0, max_tokens=100,
        extra_body={"guided_regex": THINK_THEN_ANSWER, "cache_salt": uuid.uuid4().hex}).choices[0].text


def test_thinking_comes_back_apart_from_the_answer(thinking_server, client):
    raw = _raw(client, thinking_server.engine)
    m = re.fullmatch(r"<think>\n(.*)\n</think>\n\n(.*)", raw)
    assert m is not None, raw
    message = _chat(client).choices[0].message
    assert message.reasoning_content == m.group(1).strip()
    assert message.content == m.group(2)


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
