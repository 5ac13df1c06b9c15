"""``tool_choice: "auto"``: the model's own tool-call format parsed into ``tool_calls``, end to end.

The fixture is a tiny RANDOM Qwen2-architecture model written at test time (no hub): safetensors
weights, a byte-level BPE ``tokenizer.json`` with ``<tool_call>`` / ``</tool_call>`` as added,
non-special tokens (as Qwen2.5 has them), and a ``tokenizer_config.json`` whose chat template
is written after Qwen2.5's: it renders ``tools`` inside ``<tools></tools>`` and teaches the
Hermes format ``<tool_call>{"name": ..., "arguments": ...}</tool_call>``. candle_like serves
the HF directory through the real server; the requests go through the official ``openai`` client.

What keeps these tests honest:

- A random model never writes the format by itself, so its output is steered by a grammar
  (``guided_regex``) that admits only Hermes calls whose ARGUMENTS THE MODEL CHOOSES (a city
  of 3-8 letters, an optional sentence before the call). Nothing is hard-coded: the expected
  ``tool_calls`` are derived from the model's raw text, which the same request with
  ``tool_choice: "none"`` returns as plain content (greedy; each request has its own
  ``cache_salt`` so both run the same full prefill and their numerics are identical). The
  tests fail if the template is not detected as Hermes, if the tools do not reach the prompt,
  if the parser or the OpenAI shapes (content, ``finish_reason``, streamed deltas) are wrong,
  or if a call to an unknown function is turned into a call.
- "The template rendered the tools" is checked on the text the server tokenized: its
  ``usage.prompt_tokens`` equals the token count of the template rendered with the tools, and
  that text contains the tools' JSON.
- A template that renders no tools (the embedded SmolLM2's) is served in ruvllm's own
  ``reply_or_call`` format instead: tests/server/test_tools_any_model.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import uuid
from pathlib import Path

import attrs
import openai
import pytest
from ruvllm.chat import render_chat
from ruvllm.guided.tools import detect_parser
from server_helpers import API_KEY, RunningServer, start_server

#: Qwen2.5's chat template, shortened to what tool calling needs (same markup and control flow).
QWEN_TOOLS_TEMPLATE = """{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0]['role'] == 'system' %}{{- messages[0]['content'] }}
{%- else %}{{- 'You are a helpful assistant.' }}{%- endif %}
{{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" }}
{{- "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
{%- for tool in tools %}{{- "\\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, "
    "\\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- elif messages[0]['role'] == 'system' %}
{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == "user" or (message.role == "system" and not loop.first)
      or (message.role == "assistant" and not message.tool_calls) %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == "assistant" %}
{{- '<|im_start|>' + message.role }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for tool_call in message.tool_calls %}
{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}
{{- '\\n<tool_call>\\n{"name": "' }}{{- tool_call.name }}{{- '", "arguments": ' }}
{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == "tool" %}
{%- if loop.index0 == 0 or messages[loop.index0 - 1].role != "tool" %}{{- '<|im_start|>user' }}{%- endif %}
{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}
{%- if loop.last or messages[loop.index0 + 1].role != "tool" %}{{- '<|im_end|>\\n' }}{%- endif %}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"""

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"], "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "What is the weather in Oslo?"}]
PREFACE = "Let me check."


def hermes_regex(name: str = "get_weather", preface: str = "?") -> str:
    """Hermes calls whose city the model chooses; ``preface`` "?" lets it choose whether a
    sentence precedes the call too, "" demands the sentence (content before the call)."""
    return (rf"({re.escape(PREFACE)}\n){preface}<tool_call>\n\{{\"name\": \"{name}\", "
            r"\"arguments\": \{\"city\": \"[a-z]{3,8}\"\}\}\n</tool_call>")


def _tiny_module():
    path = Path(__file__).resolve().parent.parent / "candle_like" / "tiny.py"
    spec = importlib.util.spec_from_file_location("ruvllm_tests_candle_like_tiny", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def write_tiny_chat_model(path: Path, chat_template: str, *, added_tokens: tuple[str, ...] = (),
                          context: int = 1024, seed: int = 0) -> Path:
    """A random 2-layer Qwen2 HF directory with ``chat_template`` and ``added_tokens`` (added,
    non-special tokens, as Qwen2.5 has its tool-call tags)."""
    from ruvllm.hf_tokenizer import USER_DEFINED, HfTokenizer
    from ruvllm_candle_like.writers import save_hf

    tiny = _tiny_module()
    vocab = tiny.tiny_tokenizer()
    vocab = attrs.evolve(vocab, tokens=[*vocab.tokens, *added_tokens],
                         token_types=[*vocab.token_types, *(USER_DEFINED for _ in added_tokens)])
    cfg = attrs.evolve(tiny.tiny_config("qwen2", len(vocab.tokens)), max_position_embeddings=context)
    return save_hf(path, cfg, tiny.tiny_weights(cfg, seed=seed),
                   HfTokenizer.from_gguf_vocab(vocab, vocab_size=cfg.vocab_size), chat_template=chat_template)


def write_tools_model(root: Path) -> Path:
    """A random Qwen2 whose chat template supports tools. The byte-level vocabulary spends a
    token per character: 1024 positions make room for the tools system prompt."""
    return write_tiny_chat_model(root / "tiny-qwen2-tools", QWEN_TOOLS_TEMPLATE,
                                 added_tokens=("<tool_call>", "</tool_call>"))


@pytest.fixture(scope="module")
def tools_server(tmp_path_factory) -> RunningServer:
    model_dir = write_tools_model(tmp_path_factory.mktemp("tools-model"))
    running = start_server(backend="candle_like", model=str(model_dir), server={"max_tokens_limit": 128})
    yield running
    running.stop()


@pytest.fixture(scope="module")
def tools_client(tools_server):
    return openai.OpenAI(base_url=tools_server.base_url, api_key=API_KEY, max_retries=0, timeout=120)


def _ask(client, tool_choice: str, regex: str, **kw):
    model = client.models.list().data[0].id
    return client.chat.completions.create(
        model=model, messages=MESSAGES, tools=[WEATHER], tool_choice=tool_choice, temperature=0,
        max_tokens=120, extra_body={"guided_regex": regex, "cache_salt": uuid.uuid4().hex}, **kw)


def _expected(raw: str) -> tuple[str | None, dict]:
    """(content, arguments) that the raw Hermes text stands for, read independently of ruvllm."""
    m = re.fullmatch(r"(?s)(.*?)\n?<tool_call>\n(\{.*\})\n</tool_call>", raw)
    assert m is not None, raw
    call = json.loads(m.group(2))
    return (m.group(1) or None), call["arguments"]


def test_the_template_renders_the_tools_into_the_prompt(tools_server, tools_client):
    engine = tools_server.engine
    assert detect_parser(engine.info.chat_template) == "hermes"
    st = engine.info.special_tokens
    with_tools = render_chat(engine.info.chat_template, MESSAGES, bos_token=st.bos_text,
                             eos_token=st.eos_text, tools=[WEATHER])
    without = render_chat(engine.info.chat_template, MESSAGES, bos_token=st.bos_text, eos_token=st.eos_text)
    assert "<tools>\n" + json.dumps(WEATHER) + "\n</tools>" in with_tools
    assert "<tools>" not in without
    r = _ask(tools_client, "auto", hermes_regex())
    assert r.usage.prompt_tokens == len(engine.encode(with_tools, add_special=False, parse_special=True))
    assert r.usage.prompt_tokens > len(engine.encode(without, add_special=False, parse_special=True))


@pytest.mark.parametrize("preface", ["?", ""], ids=["model-chooses-preface", "with-preface"])
def test_auto_turns_the_models_hermes_calls_into_tool_calls(tools_client, preface):
    plain = _ask(tools_client, "none", hermes_regex(preface=preface)).choices[0]
    raw = plain.message.content
    assert plain.finish_reason == "stop" and not plain.message.tool_calls
    content, arguments = _expected(raw)

    choice = _ask(tools_client, "auto", hermes_regex(preface=preface)).choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == content
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == arguments


def test_streamed_auto_sends_content_then_tool_call_deltas(tools_client):
    whole = _ask(tools_client, "auto", hermes_regex(preface="")).choices[0]
    assert whole.message.content == PREFACE
    content, calls, finish = "", {}, None
    for chunk in _ask(tools_client, "auto", hermes_regex(preface=""), stream=True):
        for c in chunk.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                calls.setdefault(d.index, []).append(d)
            finish = c.finish_reason or finish
    assert "<tool_call" not in content  # the call's own text is never streamed as content
    assert (content or None) == whole.message.content
    assert finish == "tool_calls" and len(calls) == 1
    (delta,) = calls[0]
    assert delta.function.name == "get_weather" and delta.id.startswith("call_")
    assert json.loads(delta.function.arguments) == json.loads(whole.message.tool_calls[0].function.arguments)


def test_a_call_to_an_unknown_function_stays_text(tools_client):
    choice = _ask(tools_client, "auto", hermes_regex(name="get_time")).choices[0]
    assert choice.finish_reason == "stop" and not choice.message.tool_calls
    assert '"name": "get_time"' in choice.message.content


def test_tool_calls_and_results_reach_the_template(tools_server, tools_client):
    """The next turn: the assistant's call and the tool's answer are rendered as Qwen2.5 does."""
    first = _ask(tools_client, "auto", hermes_regex()).choices[0]
    call = first.message.tool_calls[0]
    messages = [*MESSAGES,
                {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
    model = tools_client.models.list().data[0].id
    r = tools_client.chat.completions.create(model=model, messages=messages, tools=[WEATHER],
                                             max_tokens=4, temperature=0)
    engine = tools_server.engine
    st = engine.info.special_tokens
    # The server hands templates the arguments as an object (transformers' convention, as vLLM
    # does), so they are rendered as JSON once, not as a quoted string.
    sent = call.model_dump()
    as_template = {**sent, "function": {**sent["function"], "arguments": json.loads(call.function.arguments)}}
    as_rendered = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [as_template]},
                   messages[2]]
    rendered = render_chat(engine.info.chat_template, as_rendered, bos_token=st.bos_text,
                           eos_token=st.eos_text, tools=[WEATHER])
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"' in rendered
    assert "<tool_response>\nsunny, 21 C\n</tool_response>" in rendered
    assert r.usage.prompt_tokens == len(engine.encode(rendered, add_special=False, parse_special=True))
