"""A chat choice's engine outputs read once, as the events every surface renders.

What a chat answer means does not depend on the API it came through: a thinking model's thinking
is split from its answer, tool calls are read out of the answer where the request's tool plan
expects them (text that is, or may be the start of, a call is held back until the choice
finishes), and each sampled token's logprobs are looked up when asked for. That is done here,
once, for OpenAI's chat, the Responses API, Anthropic's messages and Ollama's chat and generate;
each surface only writes the :mod:`~ruvllm.server.lifecycle.events` in its own shapes.

The logprobs of held tool-call text are not dropped: they go out with the next text or thinking
sent, or with the finish, so a streamed answer reports every token's entry as the whole answer
does (dropping them would quietly ignore the request's ``logprobs``).
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ruvllm.errors import RuvllmError
from ruvllm.guided.tools import ToolPlan, split_tool_calls, streamable
from ruvllm.reasoning import Reasoning, ReasoningSplitter
from ruvllm.server.lifecycle.completion_service import Arrival
from ruvllm.server.lifecycle.events import (
    Answer,
    Event,
    Failed,
    Finish,
    Logprobs,
    ReasoningDelta,
    TextDelta,
    TokenLogprobs,
)
from ruvllm.tokenizer import Tokenizer
from ruvllm.types import GenerationResult, TokenLogprob, TokenOutput


@attrs.frozen
class AnswerEvents:
    """How one request's choices are read: the tokenizer (a token's own text for its logprobs),
    the logprobs asked for (None: none; else the alternatives per token), the model's thinking
    split (None: it does not think) and the tool plan, when its calls are read out of the answer
    (enforced calls, or ``auto`` with a format the model's template teaches)."""

    tokenizer: Tokenizer
    logprobs: int | None = None
    reasoning: Reasoning | None = None
    tools: ToolPlan | None = None

    @classmethod
    def of(cls, tokenizer: Tokenizer, logprobs: int | None, reasoning: Reasoning | None,
           plan: ToolPlan | None) -> AnswerEvents:
        """The reading of a request whose tool ``plan`` is read out of the answer only where it
        expects calls there (enforced calls, or ``auto`` in a format the template teaches)."""
        return cls(tokenizer, logprobs, reasoning, plan if plan is not None and plan.parses_output else None)

    def choice(self) -> ChoiceEvents:
        """A reader of one choice's outputs, as they stream."""
        return ChoiceEvents(self)

    def reports_logprobs(self, out: TokenOutput) -> bool:
        """Whether ``out`` gets a logprobs entry: asked for, and a sampled token (not text a stop
        string or the detokenizer released without one)."""
        return self.logprobs is not None and out.token_id is not None and out.logprob is not None

    def token_logprobs(self, out: TokenOutput) -> TokenLogprobs:
        assert out.token_id is not None and out.logprob is not None
        return TokenLogprobs(TokenLogprob(out.token_id, self.tokenizer.token_text(out.token_id), out.logprob),
                             out.top_logprobs[: self.logprobs or 0])

    def whole(self, outputs: Sequence[TokenOutput], result: GenerationResult) -> Answer:
        """A finished choice's answer, from its result's text (the same split and calls a stream
        of it adds up to)."""
        reasoning, text = (None, result.text) if self.reasoning is None else self.reasoning.split(result.text)
        calls = []
        if self.tools is not None:
            text, calls = split_tool_calls(text, self.tools)
        logprobs = None if self.logprobs is None else \
            tuple(self.token_logprobs(o) for o in outputs if self.reports_logprobs(o))
        return Answer(reasoning, text, tuple(calls), logprobs, _finish(result, bool(calls)))


def _finish(result: GenerationResult, called: bool) -> Finish:
    reason = result.finish_reason.value
    return Finish("tool_calls" if called and reason == "stop" else reason, result)


class ChoiceEvents:
    """One choice's outputs, as they arrive, as events (:meth:`of`)."""

    def __init__(self, reading: AnswerEvents):
        self.reading = reading
        self._splitter: ReasoningSplitter | None = None
        #: With a tool plan: the answer so far, and how much of it has been sent as text.
        self._text = ""
        self._sent = 0
        #: Logprobs of tokens whose entry has not gone out yet.
        self._unsent: list[TokenLogprobs] = []

    def of(self, item: Arrival) -> list[Event]:
        """The events of one arrival: a token, the result, or the failure."""
        if isinstance(item, TokenOutput):
            return self.token(item)
        if isinstance(item, GenerationResult):
            return self.finish(item)
        assert isinstance(item, RuvllmError)
        return [Failed(item)]

    def _split(self, text: str | None) -> tuple[str, str]:
        """``(thinking, answer)`` of the next text; None: the end."""
        reasoning = self.reading.reasoning
        if reasoning is None:
            return "", text or ""
        if self._splitter is None:
            self._splitter = reasoning.splitter()
        return self._splitter.flush() if text is None else self._splitter.feed(text)

    def _logprobs(self) -> list[Event]:
        out: list[Event] = [Logprobs(tuple(self._unsent))] if self._unsent else []
        self._unsent = []
        return out

    def token(self, out: TokenOutput) -> list[Event]:
        """A streamed token's events (none while it says nothing yet)."""
        if self.reading.reports_logprobs(out):
            self._unsent.append(self.reading.token_logprobs(out))
        thinking, text = self._split(out.text)
        plan = self.reading.tools
        if plan is not None:
            self._text += text
            ready = streamable(self._text, plan)
            text = ready[self._sent:]
            self._sent = max(self._sent, len(ready))
        said: list[Event] = [ReasoningDelta(thinking)] if thinking else []
        if text:
            said.append(TextDelta(text))
        if not said and plan is not None:  # held: its logprobs go out with what is sent next
            return []
        return self._logprobs() + said

    def finish(self, result: GenerationResult) -> list[Event]:
        """The last events: the thinking and text held back, the tool calls, then the finish."""
        thinking, text = self._split(None)
        said: list[Event] = [ReasoningDelta(thinking)] if thinking else []
        calls = []
        plan = self.reading.tools
        if plan is not None:
            content, calls = split_tool_calls(self._text + text, plan)
            text = content[self._sent:]
        if text:
            said.append(TextDelta(text))
        return [*self._logprobs(), *said, *calls, _finish(result, bool(calls))]
