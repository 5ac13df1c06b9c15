"""What a chat answer says, in no API's shapes: the events every surface renders.

The lifecycle reads a choice's engine outputs once (:mod:`ruvllm.server.lifecycle.answer_events`:
thinking split from the answer, tool calls parsed out, logprobs looked up) and says what they
mean as these events. Each surface writes them in its own shapes: OpenAI's chat chunks, the
Responses API's typed events, Anthropic's content blocks, Ollama's objects. None of them reads
another's JSON, and a tool call's arguments stay the object the model wrote (an API that sends
them as a JSON string encodes them when it writes them, and no other API decodes them back).

A streamed step is a list of events: a token's logprobs first (a surface that sends them with
the next text then has them when it sends the text), then its thinking, then its text; the last
step adds the tool calls and ends with :class:`Finish`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ruvllm.errors import RuvllmError
from ruvllm.guided.tools import ToolCall
from ruvllm.types import GenerationResult, TokenLogprob


@attrs.frozen
class TextDelta:
    """More of the answer's text."""

    text: str


@attrs.frozen
class ReasoningDelta:
    """More of a thinking model's thinking, split from its answer."""

    text: str


@attrs.frozen
class TokenLogprobs:
    """A sampled token (its own text, as the tokenizer has it) and the most probable tokens at
    its place, as many as the request asked for."""

    token: TokenLogprob
    top: tuple[TokenLogprob, ...]


@attrs.frozen
class Logprobs:
    """The logprobs of the tokens since the last that were reported (held tool-call text holds
    its tokens' entries until text or the finish goes out with them)."""

    tokens: tuple[TokenLogprobs, ...]


@attrs.frozen
class Finish:
    """The choice ended: ``reason`` is the engine's finish reason (``stop``, ``length``...), or
    ``tool_calls`` where the answer stopped at its calls; ``result`` holds the usage (prompt,
    completion and cached tokens), the timings, the token ids and the stop string that ended it."""

    reason: str
    result: GenerationResult


@attrs.frozen
class Failed:
    """The choice failed after its answer started (a surface says so in its stream)."""

    error: RuvllmError


#: One event of a chat answer: a tool call is :class:`ruvllm.guided.tools.ToolCall` (its name, id
#: and arguments as an object).
Event = TextDelta | ReasoningDelta | Logprobs | ToolCall | Finish | Failed


@attrs.frozen
class Step:
    """What one streamed step's events say together. A step's events come in one order (its
    logprobs, thinking, text, calls, then its end), so a surface writes a step as one object
    (OpenAI's chunk, Ollama's line) or as its kinds in that order (Anthropic's blocks, the
    Responses API's events) from these fields alone."""

    thinking: str = ""
    text: str = ""
    logprobs: tuple[TokenLogprobs, ...] = ()
    calls: tuple[ToolCall, ...] = ()
    finish: Finish | None = None
    failed: Failed | None = None

    @classmethod
    def of(cls, events: Sequence[Event]) -> Step:
        return cls(thinking="".join(e.text for e in events if isinstance(e, ReasoningDelta)),
                   text="".join(e.text for e in events if isinstance(e, TextDelta)),
                   logprobs=tuple(t for e in events if isinstance(e, Logprobs) for t in e.tokens),
                   calls=tuple(e for e in events if isinstance(e, ToolCall)),
                   finish=next((e for e in events if isinstance(e, Finish)), None),
                   failed=next((e for e in events if isinstance(e, Failed)), None))


@attrs.frozen
class Answer:
    """A choice's whole answer: its thinking (None when the model wrote no thinking block), its
    text (before any tool call), its calls, its logprobs (None when not asked for) and its end."""

    reasoning: str | None
    text: str
    calls: tuple[ToolCall, ...]
    logprobs: tuple[TokenLogprobs, ...] | None
    finish: Finish


def _text(token: TokenLogprob) -> str:
    return token.text


def logprob_entry(token: TokenLogprobs, name: Callable[[TokenLogprob], str] = _text) -> dict[str, Any]:
    """OpenAI chat's logprobs entry (``token``, ``logprob``, ``bytes``, ``top_logprobs``), which
    the Responses API and Ollama took as theirs; ``name`` says how a token is named (its text, or
    vLLM's ``token_id:<id>`` where OpenAI's request asks)."""

    def one(t: TokenLogprob) -> dict[str, Any]:
        shown = name(t)
        return {"token": shown, "logprob": t.logprob, "bytes": list(shown.encode())}

    return {**one(token.token), "top_logprobs": [one(t) for t in token.top]}
