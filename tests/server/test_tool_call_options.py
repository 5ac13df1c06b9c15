"""Two tool-call options the server used to ignore, now honoured ("refused, never ignored"):

- ``logprobs`` on a streamed answer with tools: every token's entry is sent exactly once, as
  the whole answer lists them, though the tool-call text itself is held back until the end;
- ``parallel_tool_calls: false`` under ``tool_choice: "auto"``: at most one call comes back
  (the first the model wrote, as vLLM does), streamed or not.

The enforced path runs on the embedded SmolLM2 (llamacpp); ``auto`` needs a template that
renders tools, so it runs on the tiny random Qwen2 model of ``test_server_tools_auto``, its
output steered into two Hermes calls whose arguments the model chooses (the order and count of
the calls are then read from its own text, as there).
"""

from __future__ import annotations

import json
import re
import uuid

import pytest
import test_server_tools_auto
from ruvllm.guided.tools import plan_tools
from ruvllm.server.openai.formatters import ChatFormatter
from ruvllm.types import FinishReason, GenerationResult, Timings, TokenLogprob, TokenOutput, Usage

# The tiny tools model's server and client: those tests' fixtures (an instance per module).
tools_server = test_server_tools_auto.tools_server
tools_client = test_server_tools_auto.tools_client
MESSAGES, WEATHER = test_server_tools_auto.MESSAGES, test_server_tools_auto.WEATHER

HERMES_TEMPLATE = "{% if tools %}<tools>{{ tools | tojson }}</tools> use <tool_call>{% endif %}..."
CALL = (r"<tool_call>\n\{\"name\": \"get_weather\", \"arguments\": \{\"city\": \"[a-z]{3,4}\"\}\}\n"
        r"</tool_call>")
#: Two calls, each with a city the model chooses: about 115 tokens of the tiny model's byte-level
#: vocabulary, within its server's max_tokens_limit of 128.
TWO_CALLS = rf"{CALL}\n{CALL}"
#: The embedded model cannot write long strings forever under the grammar: its city is bounded.
BOUNDED_WEATHER = {"type": "function", "function": {
    "name": "get_weather", "parameters": {"type": "object", "additionalProperties": False,
                                          "properties": {"city": {"type": "string", "maxLength": 12}},
                                          "required": ["city"]}}}


#: How far one token's logprob may move between two runs of the same request on a busy server.
BATCH_NUMERICS = 0.5


def _streamed(stream) -> tuple[str, list, dict[int, list], str | None, object]:
    """(content, logprob entries, tool-call deltas by index, finish reason, usage) of one choice."""
    content, entries, calls, finish, usage = "", [], {}, None, None
    for chunk in stream:
        usage = chunk.usage or usage
        for c in chunk.choices:
            content += c.delta.content or ""
            if c.logprobs is not None and c.logprobs.content:
                entries.extend(c.logprobs.content)
            for d in c.delta.tool_calls or []:
                calls.setdefault(d.index, []).append(d)
            finish = c.finish_reason or finish
    return content, entries, calls, finish, usage


def test_streamed_enforced_tool_calls_carry_every_tokens_logprobs(client, model_name):
    body = dict(model=model_name, messages=[{"role": "user", "content": "What is the weather in Oslo?"}],
                tools=[BOUNDED_WEATHER], tool_choice="required", temperature=0, max_tokens=60,
                logprobs=True, top_logprobs=2)
    # A salt of its own per request: neither finds the other's prompt cached, so both run the
    # same full prefill (a prefix-cache hit moves logprobs by ~0.03 on the AVX2 kind).
    whole = client.chat.completions.create(**body, extra_body={"cache_salt": uuid.uuid4().hex})
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert len(choice.logprobs.content) == whole.usage.completion_tokens
    content, entries, calls, finish, usage = _streamed(client.chat.completions.create(
        **body, stream=True, stream_options={"include_usage": True},
        extra_body={"cache_salt": uuid.uuid4().hex}))
    assert finish == "tool_calls" and len(calls) == 1 and content == ""
    assert len(entries) == usage.completion_tokens  # each token's entry, exactly once
    assert all(len(e.top_logprobs) == 2 for e in entries)
    (delta,) = calls[0]
    if delta.function.arguments == choice.message.tool_calls[0].function.arguments:
        # The same output (greedy; the usual case): the same entries, in the same order.
        assert [e.token for e in entries] == [e.token for e in choice.logprobs.content]
        # Each entry is its own token's: where the token is among its top_logprobs, the two
        # values are one computation. Across the two requests the values agree only within batch
        # numerics: on the AVX2 kind, a request of an earlier test still ending in the same batch
        # moved them by up to 0.25 (an entry of another position or another distribution, e.g.
        # after the grammar mask, is off by far more, and its token differs above).
        for e in entries:
            top = {t.token: t.logprob for t in e.top_logprobs}
            assert e.token not in top or top[e.token] == e.logprob
        assert [e.logprob for e in entries] == pytest.approx([e.logprob for e in choice.logprobs.content],
                                                             abs=BATCH_NUMERICS)


def _output(k: int, text: str) -> TokenOutput:
    return TokenOutput(index=k, token_id=k, text=text, logprob=-0.1 * k,
                       top_logprobs=(TokenLogprob(k, text, -0.1 * k),))


class _Tok:
    def token_text(self, token_id: int) -> str:
        return f"<{token_id}>"


def test_streamed_tool_answer_sends_each_entry_once_in_order():
    """Entries of released text go with its chunk, those of the held call with the finish."""
    plan = plan_tools([WEATHER], "auto", None, HERMES_TEMPLATE)
    fmt = ChatFormatter("chatcmpl-x", "m", _Tok(), 1, plan=plan)
    pieces = ["Sure", ". ", "<tool", "_call>", '{"name": "get_weather", ', '"arguments": {"city": "oslo"}}',
              "</tool_call>"]
    outputs = [_output(k, p) for k, p in enumerate(pieces)]
    chunks = [c for c in (fmt.token(0, o) for o in outputs) if c is not None]
    result = GenerationResult(text="".join(pieces), token_ids=tuple(range(len(pieces))),
                              finish_reason=FinishReason.STOP, timings=Timings(),
                              usage=Usage(prompt_tokens=1, completion_tokens=len(pieces)))
    chunks.append(fmt.finish(0, result))
    sent = [e["token"] for c in chunks for e in (c["choices"][0]["logprobs"] or {"content": []})["content"]]
    whole = fmt.complete([(outputs, result)], [1])
    assert sent == [e["token"] for e in whole["choices"][0]["logprobs"]["content"]]
    assert sent == [f"<{k}>" for k in range(len(pieces))]
    assert chunks[0]["choices"][0]["logprobs"]["content"][0]["token"] == "<0>"  # not held to the end
    assert chunks[-1]["choices"][0]["delta"]["tool_calls"]


def test_parallel_tool_calls_false_keeps_the_first_call_of_several():
    text = ('Checking.\n<tool_call>{"name": "get_weather", "arguments": {"city": "oslo"}}</tool_call>\n'
            '<tool_call>{"name": "get_weather", "arguments": {"city": "rome"}}</tool_call>')
    outputs = [_output(0, text)]
    result = GenerationResult(text=text, token_ids=(0,), finish_reason=FinishReason.STOP, timings=Timings(),
                              usage=Usage(prompt_tokens=1, completion_tokens=1))
    for parallel, cities in ((None, ["oslo", "rome"]), (True, ["oslo", "rome"]), (False, ["oslo"])):
        plan = plan_tools([WEATHER], "auto", parallel, HERMES_TEMPLATE)
        whole = ChatFormatter("id", "m", _Tok(), None, plan=plan).complete([(outputs, result)], [1])
        message = whole["choices"][0]["message"]
        assert [json.loads(c["function"]["arguments"])["city"] for c in message["tool_calls"]] == cities
        assert message["content"] == "Checking."
        streamed = ChatFormatter("id", "m", _Tok(), None, plan=plan)
        streamed.token(0, outputs[0])
        calls = streamed.finish(0, result)["choices"][0]["delta"]["tool_calls"]
        assert [json.loads(c["function"]["arguments"])["city"] for c in calls] == cities


# ----------------------------------------------------------------- auto, end to end


def _ask(client, tool_choice: str, **kw):
    model = client.models.list().data[0].id
    return client.chat.completions.create(
        model=model, messages=MESSAGES, tools=[WEATHER], tool_choice=tool_choice, temperature=0,
        max_tokens=128, extra_body={"guided_regex": TWO_CALLS, "cache_salt": uuid.uuid4().hex}, **kw)


def _cities(calls) -> list[str]:
    return [json.loads(c.function.arguments)["city"] for c in calls]


def test_auto_with_parallel_tool_calls_false_returns_one_call(tools_client):
    raw = _ask(tools_client, "none").choices[0].message.content
    cities = re.findall(r'"city": "([a-z]+)"', raw)
    assert len(cities) == 2, raw  # the model wrote two calls
    both = _ask(tools_client, "auto").choices[0]
    assert both.finish_reason == "tool_calls" and _cities(both.message.tool_calls) == cities
    one = _ask(tools_client, "auto", parallel_tool_calls=False).choices[0]
    assert one.finish_reason == "tool_calls" and _cities(one.message.tool_calls) == cities[:1]
    assert one.message.content is None
    stream = _ask(tools_client, "auto", parallel_tool_calls=False, stream=True)
    content, _, calls, finish, _ = _streamed(stream)
    assert finish == "tool_calls" and content == ""
    assert list(calls) == [0] and _cities(calls[0]) == cities[:1]


def test_streamed_auto_tool_answer_carries_every_tokens_logprobs(tools_client):
    whole = _ask(tools_client, "auto", logprobs=True).choices[0]
    assert whole.finish_reason == "tool_calls"
    content, entries, calls, finish, usage = _streamed(_ask(
        tools_client, "auto", logprobs=True, stream=True, stream_options={"include_usage": True}))
    assert finish == "tool_calls" and content == "" and len(calls) == 2
    assert len(entries) == usage.completion_tokens == len(whole.logprobs.content)
