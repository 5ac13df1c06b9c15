"""``echo`` on ``/v1/completions``: the prompt's own logprobs merged in front of the choice's.

OpenAI (and vLLM) answer ``echo: true`` with ``logprobs: n`` by listing the prompt tokens first
in ``logprobs``: ``token_logprobs[0]`` and ``top_logprobs[0]`` are ``null`` (nothing precedes
the first token), and ``text_offset`` counts from the start of the echoed prompt. This is the
shape lm-evaluation-harness's ``local-completions`` model reads loglikelihoods from.
``max_tokens: 0`` asks for the prompt alone: the engine scores the prompt (with ``logprobs``)
and generates nothing, so the answer is the echo with a ``length`` finish.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ruvllm.server.http.sse import sse_event
from ruvllm.server.openai.formatters import CompletionFormatter
from ruvllm.tokenizer import Tokenizer
from ruvllm.types import GenerationResult, PromptLogprob, TokenOutput


def prompt_logprob_lists(prompt_ids: Sequence[int], entries: Sequence[PromptLogprob | None],
                         tokenizer: Tokenizer, top_n: int,
                         shown: Callable[[int, str], str] = lambda _, text: text) -> dict[str, list[Any]]:
    """The legacy ``logprobs`` lists of the prompt (offsets from 0); ``shown`` names a token
    (id, text) in them (the formatter's ``return_tokens_as_token_ids``)."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = 0
    for tid, entry in zip(prompt_ids, entries, strict=True):
        text = tokenizer.token_text(tid)
        tokens.append(shown(tid, text))
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            token_lps.append(None)
            tops.append(None)
        else:
            token_lps.append(entry.logprob)
            tops.append({shown(t.token_id, t.text): t.logprob for t in entry.top_logprobs[:top_n]}
                        if top_n else None)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


class EchoFormatter(CompletionFormatter):
    """A ``text_completion`` with ``echo``, answered whole: each choice's prompt logprobs
    (with ``logprobs``) in front of its own."""

    def __init__(self, *args: Any, prompts: Mapping[int, Sequence[int]], **kwargs: Any):
        super().__init__(*args, **kwargs)
        #: Choice index -> its prompt's ids.
        self.prompts = dict(prompts)

    def complete(self, outcomes: Sequence[tuple[list[TokenOutput], GenerationResult]],
                 prompt_lengths: Sequence[int]) -> dict[str, Any]:
        response = super().complete(outcomes, prompt_lengths)
        for index, (choice, (_, result)) in enumerate(zip(response["choices"], outcomes, strict=True)):
            generated = choice["logprobs"]
            if self.logprobs is None:
                continue
            assert result.prompt_logprobs is not None, "prompt logprobs were asked of the engine"
            merged = prompt_logprob_lists(self.prompts[index], result.prompt_logprobs, self.tok,
                                          self.logprobs, self._shown)
            if generated is not None:
                for key in merged:
                    merged[key].extend(generated[key])
            choice["logprobs"] = merged
        return response


class EchoStreamFormatter(EchoFormatter):
    """A streamed ``text_completion`` with ``echo``: the prompt's chunk first, as OpenAI and vLLM
    send it, also with ``logprobs`` and with ``max_tokens: 0``.

    Plain ``echo`` sends the prompt text at once (``opening``), then the tokens as they come.
    With ``logprobs`` the prompt's chunk carries the prompt's logprobs, which reach the server
    only with the choice's result, so that choice's chunks are held and sent in order (prompt,
    then its tokens, then the finish) when it finishes.
    """

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._held: dict[int, list[dict[str, Any]]] = {}

    @property
    def _holds(self) -> bool:
        return self.logprobs is not None

    def opening(self, index: int) -> dict[str, Any] | None:
        opening = super().opening(index)
        return None if self._holds else opening

    def token(self, index: int, out: TokenOutput) -> dict[str, Any] | None:
        chunk = super().token(index, out)
        if chunk is None or not self._holds:
            return chunk
        self._held.setdefault(index, []).append(chunk)
        return None

    def _token_event(self, index: int, out: TokenOutput) -> str | None:
        if self._holds:
            chunk = self.token(index, out)
            return None if chunk is None else sse_event(chunk)
        return super()._token_event(index, out)

    def _finish_event(self, index: int, result: GenerationResult) -> str:
        """The SSE text that ends choice ``index``: its held chunks first, then the finish."""
        chunks = []
        if self._holds:
            assert result.prompt_logprobs is not None, "prompt logprobs were asked of the engine"
            lists = prompt_logprob_lists(self.prompts[index], result.prompt_logprobs, self.tok,
                                         self.logprobs or 0, self._shown)
            unsent = self._take_ids(index)  # the ending token ids: with the finish, not the prompt
            prompt = self._chunk(index, self.echo.get(index, ""), None, lists)
            chunks.append(self._with_prompt_ids(index, prompt))
            chunks.extend(self._held.pop(index, []))
            self._pending[index] = unsent
        chunks.append(self.finish(index, result))
        return "".join(sse_event(c) for c in chunks)


def completion_formatter(response_id: str, model: str, tokenizer: Tokenizer, logprobs: int | None, *,
                         echo: Mapping[int, str] | None, prompts: Mapping[int, Sequence[int]],
                         stream: bool) -> CompletionFormatter:
    """The ``text_completion`` formatter of one request; ``echo`` (choice index -> prompt text,
    None without ``echo``) and ``prompts`` (choice index -> prompt ids) are per choice."""
    if echo is None:
        return CompletionFormatter(response_id, model, tokenizer, logprobs)
    cls = EchoStreamFormatter if stream else EchoFormatter
    return cls(response_id, model, tokenizer, logprobs, echo=dict(echo), prompts=prompts)
