"""How an OpenAI completion reaches its client: one JSON body, or a stream of SSE chunks.

Both endpoints (chat and legacy completions) answer through :func:`answer`; what differs
between them is only the formatter, which turns outputs into their OpenAI shapes. The stream
sends one chunk per token; chunks that are ready at the same moment (every choice's token of
one engine step; the last finish, the usage and ``[DONE]``) share one socket write, so a client
reads the same chunks in fewer reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from ruvllm.errors import RuvllmError
from ruvllm.server.http.errors import ruvllm_error_body
from ruvllm.server.http.field_names import FieldNames, in_terms
from ruvllm.server.http.sse import DONE, sse_event
from ruvllm.server.lifecycle import answering
from ruvllm.server.lifecycle.completion_service import Outcome, Submission
from ruvllm.server.openai.formatters import ChunkFormatter
from ruvllm.server.openai.schemas import ChatCompletionRequest, CompletionRequest
from ruvllm.types import GenerationResult, TokenOutput


def stream_error(exc: RuvllmError, names: FieldNames) -> str:
    """A failure after the stream started, as OpenAI's ``error`` event naming the field the
    client sent (``names``: chat's or the text completion's table): this surface's one shape of
    an error inside a stream."""
    return sse_event(ruvllm_error_body(in_terms(exc, names))[1])


async def sse_chunks(submission: Submission, fmt: ChunkFormatter, *, include_usage: bool,
                     prompt_lengths: Sequence[int], names: FieldNames,
                     on_answer: Callable[[dict[str, Any]], None] | None = None) -> AsyncIterator[str]:
    """The SSE body of a streamed completion; a choice that fails ends it with an ``error``
    event (:func:`stream_error`) before ``[DONE]`` (its status line was sent long ago).
    ``on_answer`` is given the whole answer the stream added up to, once every choice finished
    (not when one failed)."""
    events = [sse_event(first) for first in map(fmt.opening, submission.indices) if first is not None]
    completion_tokens, failed = 0, False
    results: dict[int, GenerationResult] = {}
    outputs: dict[int, list[TokenOutput]] = {}
    batches = submission.stream()
    try:
        if events:  # the role / echo chunks go out at once, before the first token
            yield "".join(events)
            events.clear()
        async for batch in batches:
            for index, item in batch.items:
                if isinstance(item, TokenOutput):
                    if on_answer is not None:
                        outputs.setdefault(index, []).append(item)
                    event = fmt.token_event(index, item)
                    if event is not None:
                        events.append(event)
                elif isinstance(item, GenerationResult):
                    completion_tokens += item.usage.completion_tokens
                    results[index] = item
                    events.append(fmt.finish_event(index, item))
                else:
                    events.append(stream_error(item, names))
                    failed = True
            if batch.last:
                break
            if events:
                yield "".join(events)
                events.clear()
        if not failed and include_usage:
            in_order = [results[k] for k in sorted(results)]
            events.append(sse_event(fmt.usage(sum(prompt_lengths), completion_tokens, in_order,
                                              len(prompt_lengths))))
        events.append(DONE)
        yield "".join(events)
        if not failed and on_answer is not None:
            outcomes = [(outputs.get(k, []), results[k]) for k in sorted(results)]
            on_answer(fmt.with_vllm_fields(fmt.complete(outcomes, prompt_lengths), [r for _, r in outcomes]))
    finally:
        await batches.aclose()


async def answer(submission: Submission, fmt: ChunkFormatter, request: Request,
                 body: ChatCompletionRequest | CompletionRequest, prompt_lengths: Sequence[int],
                 names: FieldNames, on_answer: Callable[[dict[str, Any]], None] | None = None) -> Response:
    """The response to a submitted completion: streamed when the body asks, else the whole
    answer once every choice finished (status 499, nothing else, when the client left first).
    ``names``: the body's table, for a refusal inside the stream; ``on_answer`` is given the
    whole answer (a stream's once it has added up)."""
    include_usage = bool(body.stream_options and body.stream_options.include_usage)

    def streamed() -> AsyncIterator[str]:
        return sse_chunks(submission, fmt, include_usage=include_usage, prompt_lengths=prompt_lengths,
                          names=names, on_answer=on_answer)

    def whole(outcomes: list[Outcome]) -> Response:
        answered = fmt.with_vllm_fields(fmt.complete(outcomes, prompt_lengths), [r for _, r in outcomes])
        if on_answer is not None:
            on_answer(answered)
        return JSONResponse(answered)

    return await answering.answer(submission, request, streamed=streamed if body.stream else None,
                                  whole=whole)
