"""Chat completion responses whose output may be tool calls, in OpenAI's shapes.

Wraps the server's :class:`~ruvllm.server.lifecycle.formatters.ChatFormatter`: text the model writes
before a tool call streams as ``content`` (in the ``reply_or_call`` format, the reply decoded
out of its JSON as it comes); text that is (or may be the start of) a tool call is held back
and, once the choice finishes, sent as ``delta.tool_calls`` (``index``, ``id``, ``type``,
``function.name``, ``function.arguments``) with ``finish_reason: "tool_calls"``.
Enforced calls (``required`` / named) never stream content.

With ``logprobs`` a streamed answer reports every token's entry, as the whole answer does: an
entry goes out with the first chunk sent after its token arrived (the token's text may still
be held), and the entries of the held tool-call text with the finish. Dropping them would
quietly ignore the request's ``logprobs``.

A server formatter, so it lives in ``server/`` (it used to sit in ``guided/``, which then imported
the server: an upward import that the layering check, tests/core/test_layering.py, refuses).
"""

from __future__ import annotations

from typing import Any

from ruvllm.guided.tools import ToolPlan, split_tool_calls, streamable
from ruvllm.reasoning import Reasoning
from ruvllm.server.http.sse import sse_event
from ruvllm.server.lifecycle.formatters import ChatFormatter
from ruvllm.tokenizer import Tokenizer
from ruvllm.types import TokenOutput


class ToolChatFormatter(ChatFormatter):
    def __init__(self, *args: Any, plan: ToolPlan, legacy_functions: bool = False, **kwargs: Any):
        """``legacy_functions``: the request used the deprecated functions API, whose one call
        comes back as ``function_call`` with ``finish_reason: "function_call"``."""
        super().__init__(*args, **kwargs)
        self.plan = plan
        self.legacy_functions = legacy_functions
        self._text: dict[int, str] = {}
        self._sent: dict[int, int] = {}
        #: Choice index -> logprobs entries of tokens whose entry has not been sent yet.
        self._entries: dict[int, list[dict[str, Any]]] = {}

    def _unsent_logprobs(self, index: int) -> dict[str, Any] | None:
        entries = self._entries.pop(index, None)
        return {"content": entries} if entries else None

    def token(self, index: int, out: TokenOutput) -> dict[str, Any] | None:
        if self._reports_lp(out):
            self._entries.setdefault(index, []).append(self._lp_entry(out))
        thinking, answer = self._split(index, out.text)
        text = self._text.get(index, "") + answer
        self._text[index] = text
        ready = streamable(text, self.plan)
        sent = self._sent.get(index, 0)
        if len(ready) <= sent and not thinking:
            return None
        self._sent[index] = max(sent, len(ready))
        return self._chunk(index, self._delta(thinking, ready[sent:]), None, self._unsent_logprobs(index))

    def _token_event(self, index: int, out: TokenOutput) -> str | None:
        chunk = self.token(index, out)
        return None if chunk is None else sse_event(chunk)

    def finish(self, index: int, reason: str) -> dict[str, Any]:
        thinking, answer = self._split(index, None)
        text = self._text.get(index, "") + answer
        content, calls = split_tool_calls(text, self.plan)
        sent = self._sent.get(index, 0)
        delta: dict[str, Any] = {"reasoning_content": thinking} if thinking else {}
        if len(content) > sent:
            delta["content"] = content[sent:]
        if calls:
            key, value = self._calls(calls, streamed=True)
            delta[key] = value
            reason = key if reason == "stop" else reason
        return self._chunk(index, delta, reason, self._unsent_logprobs(index))

    def _calls(self, calls: list[Any], *, streamed: bool) -> tuple[str, Any]:
        """The answer's calls as OpenAI returns them: ``tool_calls``, or the functions API's one
        ``function_call`` (a plan for it allows one call)."""
        if self.legacy_functions:
            call = calls[0].openai()["function"]
            return "function_call", call
        return "tool_calls", [c.openai(k if streamed else None) for k, c in enumerate(calls)]

    def complete(self, outcomes, prompt_lengths) -> dict[str, Any]:
        out = super().complete(outcomes, prompt_lengths)
        for choice in out["choices"]:
            message = choice["message"]
            content, calls = split_tool_calls(message["content"] or "", self.plan)
            message["content"] = content or (None if calls else content)
            if calls:
                key, value = self._calls(calls, streamed=False)
                message[key] = value
                if choice["finish_reason"] == "stop":
                    choice["finish_reason"] = key
        return out


def chat_formatter(response_id: str, model: str, tokenizer: Tokenizer, logprobs: int | None,
                   plan: ToolPlan, reasoning: Reasoning | None = None, *,
                   predicted: bool = False, legacy_functions: bool = False) -> ChatFormatter:
    """The formatter of one chat request: tool calls are read out of the output only where the
    plan expects them (enforced calls, or ``auto`` with a format the model's template teaches),
    and from the answer only, after the thinking (``reasoning``) is split off."""
    if plan.parses_output:
        return ToolChatFormatter(response_id, model, tokenizer, logprobs, plan=plan, reasoning=reasoning,
                                 predicted=predicted, legacy_functions=legacy_functions)
    return ChatFormatter(response_id, model, tokenizer, logprobs, reasoning=reasoning, predicted=predicted)
