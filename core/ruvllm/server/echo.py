"""``echo`` on ``/v1/completions``: the prompt's own logprobs merged in front of the choice's.

OpenAI (and vLLM) answer ``echo: true`` with ``logprobs: n`` by listing the prompt tokens first
in ``logprobs``: ``token_logprobs[0]`` and ``top_logprobs[0]`` are ``null`` (nothing precedes
the first token), and ``text_offset`` counts from the start of the echoed prompt. This is the
shape lm-evaluation-harness's ``local-completions`` model reads loglikelihoods from.
``max_tokens: 0`` asks for the prompt alone: the engine still samples one token (it has to run
the prompt's last position anyway), and that token is left out of the answer.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ruvllm.server.responses import CompletionFormatter
from ruvllm.server.sse import sse_event
from ruvllm.tokenizer import Tokenizer
from ruvllm.types import GenerationResult, PromptLogprob, TokenOutput


def prompt_logprob_lists(prompt_ids: Sequence[int], entries: Sequence[PromptLogprob | None],
                         tokenizer: Tokenizer, top_n: int) -> dict[str, list[Any]]:
    """The legacy ``logprobs`` lists of the prompt (offsets from 0)."""
    tokens: list[str] = []
    token_lps: list[float | None] = []
    tops: list[dict[str, float] | None] = []
    offsets: list[int] = []
    offset = 0
    for tid, entry in zip(prompt_ids, entries, strict=True):
        text = tokenizer.token_text(tid)
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
        if entry is None:
            token_lps.append(None)
            tops.append(None)
        else:
            token_lps.append(entry.logprob)
            tops.append({t.text: t.logprob for t in entry.top_logprobs[:top_n]} if top_n else None)
    return {"tokens": tokens, "token_logprobs": token_lps, "top_logprobs": tops, "text_offset": offsets}


def merge_echo(response: dict[str, Any], results: Sequence[GenerationResult],
               prompts: Sequence[Sequence[int]], echoes: Sequence[str], tokenizer: Tokenizer, *,
               top_n: int | None, echo_only: bool) -> dict[str, Any]:
    """Complete a ``text_completion`` built with ``echo``: prepend each choice's prompt logprobs
    (``top_n`` not None) and, with ``echo_only`` (``max_tokens: 0``), drop the generated token.

    ``results[i]``, ``prompts[i]`` and ``echoes[i]`` belong to ``response["choices"][i]``.
    """
    for choice, result, ids, echo in zip(response["choices"], results, prompts, echoes, strict=True):
        generated = choice["logprobs"]
        if echo_only:
            choice["text"] = echo
            choice["finish_reason"] = "length"
        if top_n is None:
            continue
        assert result.prompt_logprobs is not None, "prompt logprobs were asked of the engine"
        merged = prompt_logprob_lists(ids, result.prompt_logprobs, tokenizer, top_n)
        if generated is not None and not echo_only:
            for key in merged:
                merged[key].extend(generated[key])
        choice["logprobs"] = merged
    if echo_only:
        usage = response["usage"]
        usage["completion_tokens"] = 0
        usage["total_tokens"] = usage["prompt_tokens"]
    return response


class EchoStreamFormatter(CompletionFormatter):
    """A streamed ``text_completion`` with ``echo``: the prompt's chunk first, as OpenAI and vLLM
    send it, also with ``logprobs`` and with ``max_tokens: 0``.

    Plain ``echo`` sends the prompt text at once (``opening``), then the tokens as they come.
    With ``logprobs`` the prompt's chunk carries the prompt's logprobs, which reach the server
    only with the choice's result, so that choice's chunks are held and sent in order (prompt,
    then its tokens, then the finish) when it finishes. ``max_tokens: 0`` (echo only) sends the
    prompt and a ``length`` finish; the one token the engine had to sample is never sent or
    counted.
    """

    def __init__(self, *args: Any, prompts: Mapping[int, Sequence[int]], echo_only: bool, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.prompts = dict(prompts)
        self.echo_only = echo_only
        self._held: dict[int, list[dict[str, Any]]] = {}

    @property
    def _holds(self) -> bool:
        return self.logprobs is not None

    def opening(self, index: int) -> dict[str, Any] | None:
        opening = super().opening(index)
        return None if self._holds else opening

    def token(self, index: int, out: TokenOutput) -> dict[str, Any] | None:
        if self.echo_only:
            return None
        chunk = super().token(index, out)
        if chunk is None or not self._holds:
            return chunk
        self._held.setdefault(index, []).append(chunk)
        return None

    def token_event(self, index: int, out: TokenOutput) -> str | None:
        if self.echo_only or self._holds:
            chunk = self.token(index, out)
            return None if chunk is None else sse_event(chunk)
        return super().token_event(index, out)

    def finish_event(self, index: int, result: GenerationResult) -> str:
        """The SSE text that ends choice ``index``: its held chunks first, then the finish."""
        chunks = []
        if self._holds:
            assert result.prompt_logprobs is not None, "prompt logprobs were asked of the engine"
            lists = prompt_logprob_lists(self.prompts[index], result.prompt_logprobs, self.tok,
                                         self.logprobs or 0)
            chunks.append(self._chunk(index, self.echo.get(index, ""), None, lists))
            chunks.extend(self._held.pop(index, []))
        reason = "length" if self.echo_only else result.finish_reason.value
        chunks.append(self.finish(index, reason))
        return "".join(sse_event(c) for c in chunks)

    def usage(self, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        return super().usage(prompt_tokens, 0 if self.echo_only else completion_tokens)


def finish_event(fmt: Any, index: int, result: GenerationResult) -> str:
    """The SSE text ending a streamed choice: the formatter's own when it has one (echo)."""
    own = getattr(fmt, "finish_event", None)
    return own(index, result) if own is not None else sse_event(fmt.finish(index, result.finish_reason.value))


def completion_formatter(response_id: str, model: str, tokenizer: Tokenizer, logprobs: int | None, *,
                         echo: Mapping[int, str], prompts: Mapping[int, Sequence[int]], stream: bool,
                         echo_only: bool) -> CompletionFormatter:
    """The ``text_completion`` formatter of one request: a streamed echo gets its own."""
    if stream and echo:
        return EchoStreamFormatter(response_id, model, tokenizer, logprobs, echo=dict(echo),
                                   prompts=prompts, echo_only=echo_only)
    return CompletionFormatter(response_id, model, tokenizer, logprobs, echo=dict(echo))
