"""A reasoning model's thinking (``<think>...</think>``) told apart from its answer, streamed or whole.

Reasoning models (DeepSeek-R1 and its distillations, Qwen3, SmolLM3...) write their thinking
between tags before the answer, and some chat templates open the tag in the prompt, so that the
output starts inside it. Every serving peer returns the thinking apart from the answer: vLLM and
SGLang as ``reasoning_content``, llama-server by ``--reasoning-format``, Ollama as
``message.thinking``, Anthropic as ``thinking`` blocks. One splitter, here, serves every API
surface, and the whole answer is split by the same code as the stream (so the two always agree).

The rules are llama-server's and Ollama's: thinking is recognised only at the start of the output
(after whitespace) or when the prompt left the block open; it ends at the first end tag, and an
answer that never closes it is all thinking (cut short by ``max_tokens``). Whitespace around the
thinking and at the start of the answer is the template's layout, not text, and is dropped.
"""

from __future__ import annotations

import enum

import attrs


@attrs.frozen
class ReasoningTags:
    start: str = "<think>"
    end: str = "</think>"

    def opened_by(self, prompt: str) -> bool:
        """Whether ``prompt`` (the rendered chat prompt) ends inside a thinking block, as the
        templates of DeepSeek-R1 and of Qwen3 with thinking on leave it."""
        at = prompt.rfind(self.start)
        return at >= 0 and self.end not in prompt[at:]

    def used_by(self, chat_template: str | None) -> bool:
        """Whether a chat template handles these tags (every thinking template cuts earlier answers
        at the end tag); llama-server's ``--reasoning-format auto``."""
        return bool(chat_template) and self.end in chat_template


THINK_TAGS = ReasoningTags()
#: ``[server] reasoning_format`` / ``--reasoning-format`` (llama-server's names): ``auto`` splits
#: the thinking out where the model's chat template writes think tags, ``deepseek`` always,
#: ``none`` never (the tags stay in the answer).
REASONING_FORMATS = ("auto", "deepseek", "none")


@attrs.frozen
class Reasoning:
    """How one request's outputs are split: the tags, and whether its prompt opened them."""

    tags: ReasoningTags = THINK_TAGS
    opened: bool = False

    def splitter(self) -> ReasoningSplitter:
        return ReasoningSplitter(self.tags, opened=self.opened)

    def split(self, text: str) -> tuple[str | None, str]:
        return split_reasoning(text, self.tags, opened=self.opened)


def reasoning_for(reasoning_format: str, chat_template: str | None, prompt: str) -> Reasoning | None:
    """The split of a chat request's outputs (None: all answer), from the server's format, the
    model's chat template and the end of the rendered prompt."""
    if reasoning_format == "deepseek" or (reasoning_format == "auto" and THINK_TAGS.used_by(chat_template)):
        return Reasoning(THINK_TAGS, THINK_TAGS.opened_by(prompt))
    return None


class _State(enum.Enum):
    BEFORE = "before"  # nothing but whitespace yet: the start tag may still come
    THINKING = "thinking"
    AFTER = "after"  # the end tag passed: whitespace before the answer is dropped
    ANSWER = "answer"


def _held_prefix(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that begins ``tag`` (it may be the tag, cut)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ReasoningSplitter:
    """Output text in, ``(thinking, answer)`` deltas out; text that may be a tag cut in two is
    held back until the next piece (or :meth:`flush`) says what it is."""

    def __init__(self, tags: ReasoningTags = THINK_TAGS, *, opened: bool = False) -> None:
        self.tags = tags
        self._state = _State.THINKING if opened else _State.BEFORE
        self._pending = ""
        #: Whether any thinking came out, so that a stripped lead is stripped once.
        self._thought = False
        #: Whether the output had a thinking block (possibly empty).
        self.thinks = opened

    def feed(self, text: str) -> tuple[str, str]:
        thinking, answer = [], []
        self._pending += text
        while self._pending:
            pending = self._pending
            if self._state is _State.BEFORE:
                lead = pending.lstrip()
                if lead.startswith(self.tags.start):
                    self._state, self._pending = _State.THINKING, lead[len(self.tags.start):]
                    self.thinks = True
                elif not lead or self.tags.start.startswith(lead):
                    break  # whitespace, or the start tag cut short: wait for more
                else:
                    self._state = _State.ANSWER
            elif self._state is _State.THINKING:
                if not self._thought:
                    pending = self._pending = pending.lstrip()
                    if not pending:
                        break
                end = pending.find(self.tags.end)
                if end >= 0:
                    thinking.append(pending[:end].rstrip())
                    self._state, self._pending = _State.AFTER, pending[end + len(self.tags.end):]
                    self._thought = True
                    continue
                # Trailing whitespace may be the layout before the end tag: held with a cut tag.
                body = pending[:len(pending) - _held_prefix(pending, self.tags.end)]
                keep = len(body) - len(body.rstrip())
                out = body[:len(body) - keep]
                if out:
                    thinking.append(out)
                    self._thought = True
                self._pending = pending[len(out):]
                break
            elif self._state is _State.AFTER:
                self._pending = pending.lstrip()
                if self._pending:
                    self._state = _State.ANSWER
            else:
                answer.append(pending)
                self._pending = ""
        return "".join(thinking), "".join(answer)

    def flush(self) -> tuple[str, str]:
        """What is held at the end of the output: a cut tag that never finished is text."""
        pending, self._pending = self._pending, ""
        if self._state is _State.THINKING:
            return pending.rstrip(), ""
        if self._state is _State.BEFORE:
            self._state = _State.ANSWER
            return "", pending
        return "", pending if self._state is _State.ANSWER else ""


def split_reasoning(text: str, tags: ReasoningTags = THINK_TAGS, *,
                    opened: bool = False) -> tuple[str | None, str]:
    """``(thinking, answer)`` of a whole output; thinking is None when it had no thinking block."""
    splitter = ReasoningSplitter(tags, opened=opened)
    thinking, answer = splitter.feed(text)
    more_thinking, more_answer = splitter.flush()
    return (thinking + more_thinking if splitter.thinks else None), answer + more_answer
