"""Turning sampled tokens into a request's output: the part every path shares.

Both the request-level path (a backend's ``generate`` iterator) and the ServingEngine feed
tokens through :class:`RequestOutputBuilder`, so stop handling, detokenization, usage and
finish reasons are decided in exactly one place.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

from ruvllm.errors import ContextLengthExceeded, InvalidRequest
from ruvllm.stops import StopStringMatcher
from ruvllm.tokenizer import IncrementalDetokenizer, Tokenizer, require_in_vocabulary
from ruvllm.types import (
    FinishReason,
    GenerationParams,
    GenerationResult,
    SampledToken,
    Timings,
    TokenLogprob,
    TokenOutput,
    Usage,
)


def check_prompt(prompt_ids: Sequence[int], params: GenerationParams, context_length: int,
                 vocab_size: int, *, limit_note: str = "") -> None:
    """Reject a prompt that cannot be served, before any engine state is touched."""
    if len(prompt_ids) == 0:
        raise InvalidRequest("prompt", "must contain at least one token; got an empty prompt")
    require_in_vocabulary("prompt", prompt_ids, vocab_size)
    if len(prompt_ids) + params.max_tokens > context_length:
        raise ContextLengthExceeded(len(prompt_ids), params.max_tokens, context_length, limit_note=limit_note)


def require_core_sampler(path: str, backend_name: str, field: str, what: str) -> None:
    """Refuse ``field`` (``what`` it asks for) where core's sampler does not choose the tokens:
    on the request-level path the backend's generate() samples by itself, so logits processors
    and grammars would be ignored. The one place this refusal is worded."""
    if path != "executor":
        raise InvalidRequest(
            field, f"{what} needs core's sampler on the executor path, but backend {backend_name!r} is "
            "served request by request with its own sampler; drop it or serve the model with a backend "
            "that has an executor (llamacpp, candle_like, mlx)")


def ending_ids(params: GenerationParams, tokenizer: Tokenizer) -> frozenset[int]:
    """The token ids that end a request: its ``stop_token_ids``, and EOS unless ``ignore_eos``
    (what core's sampler keeps out until ``min_tokens``)."""
    eos = frozenset() if params.ignore_eos else frozenset(tokenizer.eos_ids)
    return frozenset(params.stop_token_ids) | eos


class RequestOutputBuilder:
    """Accumulates one request's tokens and decides when and why it finishes."""

    def __init__(self, tokenizer: Tokenizer, prompt_ids: Sequence[int], params: GenerationParams):
        self._tok = tokenizer
        self.params = params
        self.prompt_len = len(prompt_ids)
        self._detok = IncrementalDetokenizer(tokenizer, skip_special=params.skip_special_tokens,
                                             context=prompt_ids)
        self._stops = StopStringMatcher(params.stop)
        self._stop_ids = ending_ids(params, tokenizer)
        self.token_ids: list[int] = []
        self._text: list[str] = []
        self._logprobs: list[TokenLogprob] = []
        #: Nothing to generate (max_tokens 0): finished before the first token.
        self.finish_reason: FinishReason | None = FinishReason.LENGTH if params.max_tokens == 0 else None
        self.stop_reason: str | int | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def add(self, token: SampledToken) -> TokenOutput:
        """Record one sampled token; sets :attr:`finish_reason` when it ends the request."""
        tid = token.token_id
        index = len(self.token_ids)
        self.token_ids.append(tid)
        text = ""
        if tid in self._stop_ids:
            self.finish_reason, self.stop_reason = FinishReason.STOP, tid
            if self.params.include_stop_str_in_output:
                # After any text held back as a possible stop-string prefix, which it ends.
                text = self._stops.flush() + self._detok.push(tid)
        elif index < self.params.min_tokens:
            # vLLM's min_tokens: stop strings are matched only in what follows.
            text = self._detok.push(tid)
        else:
            text = self._stops.feed(self._detok.push(tid))
            if self._stops.matched is not None:
                self.finish_reason, self.stop_reason = FinishReason.STOP, self._stops.matched
                text += self._included_stop()
        if self.finish_reason is None and len(self.token_ids) >= self.params.max_tokens:
            self.finish_reason = FinishReason.LENGTH
        if self.finish_reason is not None and self._stops.matched is None:
            # Ended by length or by a stop/EOS token: text held back as a possible stop-string
            # prefix (or a dangling partial character) is part of the output, so release it.
            text += self._flush_tail()
        self._text.append(text)
        lp = self._logprob_of(token)
        return TokenOutput(
            index=index, token_id=tid, text=text,
            logprob=token.logprob, top_logprobs=lp,
        )

    def finish(self, reason: FinishReason) -> str:
        """End early (engine ran out of context, cancellation, error); returns held-back text."""
        self.finish_reason = reason
        tail = ""
        if reason is FinishReason.LENGTH:
            tail = self._flush_tail()
            self._text.append(tail)
        return tail

    def _flush_tail(self) -> str:
        """Release what the detokenizer and the stop matcher still hold.

        The released text can itself complete a stop string (its last characters were held
        back); then the request ends on that stop and the text after it is dropped.
        """
        tail = self._stops.feed(self._detok.flush())
        if self._stops.matched is not None:
            self.finish_reason, self.stop_reason = FinishReason.STOP, self._stops.matched
            return tail + self._included_stop()
        return tail + self._stops.flush()

    def _included_stop(self) -> str:
        """The matched stop string, where the request wants it in its text."""
        if self.params.include_stop_str_in_output and self._stops.matched is not None:
            return self._stops.matched
        return ""

    def _logprob_of(self, token: SampledToken) -> tuple[TokenLogprob, ...]:
        if token.logprob is None:
            return ()
        self._logprobs.append(
            TokenLogprob(token.token_id, self._tok.token_text(token.token_id), token.logprob)
        )
        return tuple(TokenLogprob(i, self._tok.token_text(i), lp) for i, lp in token.top_logprobs)

    def result(self, timings: Timings) -> GenerationResult:
        assert self.finish_reason is not None, "result() before the request finished"
        return GenerationResult(
            text="".join(self._text),
            token_ids=tuple(self.token_ids),
            finish_reason=self.finish_reason,
            usage=Usage(prompt_tokens=self.prompt_len, completion_tokens=len(self.token_ids)),
            timings=timings,
            logprobs=tuple(self._logprobs) if self.params.logprobs is not None else None,
            stop_reason=self.stop_reason,
        )


class GenerationStream:
    """Iterator of :class:`TokenOutput`; :attr:`result` is set once it is exhausted.

    Wraps a backend's token iterator, closing it as soon as the request is finished so the
    backend frees the request's state at once.
    """

    def __init__(self, tokens: Iterator[SampledToken], builder: RequestOutputBuilder,
                 queued_at: float | None = None):
        self._tokens = tokens
        self._builder = builder
        self._start = time.perf_counter()
        self._queue = 0.0 if queued_at is None else self._start - queued_at
        self._first: float | None = None
        self.result: GenerationResult | None = None

    def __iter__(self) -> Iterator[TokenOutput]:
        b = self._builder
        try:
            for token in () if b.finished else self._tokens:
                if self._first is None:
                    self._first = time.perf_counter()
                out = b.add(token)
                yield out
                if b.finished:
                    break
            else:
                # The backend stopped on its own: its context window is full.
                tail = b.finish(FinishReason.LENGTH)
                if tail:
                    yield TokenOutput(index=len(b.token_ids), token_id=None, text=tail)
        except GeneratorExit:
            if not b.finished:
                b.finish(FinishReason.CANCELLED)
            raise
        finally:
            close = getattr(self._tokens, "close", None)
            if close is not None:
                close()
            if b.finish_reason is None:
                b.finish(FinishReason.ERROR)
            self.result = b.result(self._timings())

    def _timings(self) -> Timings:
        end = time.perf_counter()
        first = self._first if self._first is not None else end
        return Timings(
            queue=self._queue,
            prefill=first - self._start,
            decode=end - first,
            time_to_first_token=self._queue + first - self._start,
        )

    def collect(self) -> GenerationResult:
        """Run to the end and return the final result."""
        for _ in self:
            pass
        assert self.result is not None
        return self.result
