"""A completion's request lifecycle, the same for every API surface.

A surface turns its body into the lifecycle's neutral request
(:mod:`ruvllm.server.lifecycle.request_input`), which becomes prompt ids and
:class:`~ruvllm.types.GenerationParams`, and the outputs back into its own JSON.
Everything in between lives here, so that every surface refuses, cancels and batches alike:

- Each choice is its own engine request, and all of them are submitted before the first is
  awaited, so that the engine batches them. If one is refused (bad parameters, context too long,
  queue full), those already accepted are cancelled and the refusal propagates with its real
  status: nothing has reached the client yet.
- A client that goes away cancels every choice that has not finished: while a whole answer is
  awaited its connection is polled; a stream cancels when its consumer closes it (or, if the
  consumer never started it, when :meth:`Submission.cancel` is called).
- Streamed outputs come in batches: whatever every choice produced by the time the consumer
  looks is one batch, so the tokens one engine step made for all choices can leave in one write.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncGenerator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

import attrs

from ruvllm.errors import BackendError, InvalidRequest, RuvllmError
from ruvllm.generation import check_prompt
from ruvllm.sampling import LogitsProcessor
from ruvllm.server.lifecycle.model_pool import Route
from ruvllm.server.lifecycle.params import Limits, generation_params
from ruvllm.server.lifecycle.request_input import RequestInput
from ruvllm.serving import AsyncEngine, RequestHandle
from ruvllm.tokenizer import require_encodable
from ruvllm.types import FinishReason, GenerationParams, GenerationResult, TokenOutput

T = TypeVar("T")
#: One choice's streamed outputs and its result.
Outcome = tuple[list[TokenOutput], GenerationResult]

#: What a stream delivers for one choice: a token, its (successful) result, or its failure.
Arrival = TokenOutput | GenerationResult | RuvllmError


@attrs.frozen(kw_only=True)
class ChoiceRequest:
    """One choice to generate; it becomes one engine request."""

    #: The choice's index in the response (``n`` choices per prompt, prompt after prompt).
    index: int
    prompt_ids: Sequence[int]
    params: GenerationParams
    #: This choice's own logits processors (its grammar): they keep per-sequence state, so
    #: choices never share them.
    processors: Sequence[LogitsProcessor] = ()


@attrs.frozen
class Batch:
    """What the choices produced by the time the consumer looked, in arrival order."""

    #: ``(choice index, arrival)`` pairs.
    items: list[tuple[int, Arrival]]
    #: The stream ends with this batch: every choice has finished, or one failed (and the
    #: others were cancelled), so a consumer can send its closing events in the same write.
    last: bool


@attrs.define
class _Running:
    index: int
    handle: RequestHandle
    finished: bool = False


def _failure(running: _Running, cause: object) -> RuvllmError:
    """The error a failed choice is reported as: the engine's own when it raised one."""
    if isinstance(cause, RuvllmError):
        return cause
    if isinstance(cause, GenerationResult):
        return BackendError(f"request {running.handle.request_id} failed in the engine")
    return BackendError(f"request {running.handle.request_id} failed: {cause}")


class Submission:
    """The engine requests of one API request, from their submission to their last output.

    Consume it once: either :meth:`results` (a whole answer) or :meth:`stream`.
    """

    def __init__(self, response_id: str, running: list[_Running]):
        #: The response's id; each choice's engine request id is ``<id>-<index>``.
        self.id = response_id
        self._running = running

    @property
    def indices(self) -> list[int]:
        return [r.index for r in self._running]

    def cancel(self) -> None:
        """Cancel every choice that has not finished (idempotent): their KV is freed at once."""
        for r in self._running:
            if not r.finished:
                r.finished = True
                r.handle.cancel()

    def cancel_choice(self, index: int) -> None:
        """Cancel one choice that a surface's own rule ended early (llama-server's editor stops);
        its result still arrives, as cancelled."""
        for r in self._running:
            if r.index == index:
                r.handle.cancel()

    async def results(self, client_gone: Callable[[], Awaitable[bool]], *,
                      poll_seconds: float = 0.25) -> list[Outcome] | None:
        """Every choice's outputs and result, in submission order, or None when ``client_gone``
        turned true first (every choice is then cancelled). A choice that failed in the engine
        raises (:class:`~ruvllm.errors.BackendError` unless the engine raised its own error) and
        cancels the others."""
        return await self.unless_gone(asyncio.gather(*(self._collect(r) for r in self._running)), client_gone,
                                      poll_seconds=poll_seconds)

    async def unless_gone(self, work: Awaitable[T], client_gone: Callable[[], Awaitable[bool]], *,
                          poll_seconds: float = 0.25) -> T | None:
        """``work``'s result (what a surface makes of this submission's outputs: every choice's
        outcome, or llama-server's final objects), or None when ``client_gone`` turned true first,
        polled every ``poll_seconds`` meanwhile; either way every unfinished choice is cancelled."""
        work = asyncio.ensure_future(work)

        async def watch() -> None:
            while not await client_gone():
                await asyncio.sleep(poll_seconds)

        watcher = asyncio.ensure_future(watch())
        try:
            done, _ = await asyncio.wait({work, watcher}, return_when=asyncio.FIRST_COMPLETED)
            return work.result() if work in done else None
        finally:
            watcher.cancel()
            if not work.done():
                work.cancel()
            # Retrieve the outcome so that a cancelled gather is not reported as "never retrieved".
            work.add_done_callback(lambda f: f.cancelled() or f.exception())
            self.cancel()

    async def _collect(self, running: _Running) -> Outcome:
        outputs = [out async for out in running.handle]
        result = await running.handle.result()
        running.finished = True
        if result.finish_reason is FinishReason.ERROR:
            raise _failure(running, result)
        return outputs, result

    async def stream(self) -> AsyncGenerator[Batch, None]:
        """The outputs as they arrive, in batches, ending with the batch marked ``last``.

        Closing the generator early (the client went away) cancels the unfinished choices.
        """
        remaining = len(self._running)
        source = self._arrivals()
        try:
            async for arrived in source:
                items: list[tuple[int, Arrival]] = []
                failed = False
                for running, item in arrived:
                    if isinstance(item, TokenOutput):
                        items.append((running.index, item))
                        continue
                    running.finished = True
                    remaining -= 1
                    if isinstance(item, GenerationResult) and item.finish_reason is not FinishReason.ERROR:
                        items.append((running.index, item))
                        continue
                    items.append((running.index, _failure(running, item)))
                    failed = True
                    break
                last = failed or not remaining
                yield Batch(items, last)
                if last:
                    return
        finally:
            await source.aclose()
            self.cancel()

    async def writes(self, render: Callable[[Arrival], list[str]], *,
                     first: str = "") -> AsyncGenerator[str, None]:
        """The stream of a one-choice answer as the text its API surface sends: ``first`` at
        once, then what ``render`` makes of each arrival (a token, the result, or the failure),
        a batch's text in one write. Closing it closes the stream (which cancels the choice)."""
        batches = self.stream()
        try:
            if first:
                yield first
            async for batch in batches:
                text = "".join(part for _, item in batch.items for part in render(item))
                if text:
                    yield text
        finally:
            await batches.aclose()

    async def _arrivals(self) -> AsyncGenerator[list[tuple[_Running, object]], None]:
        """Lists of ``(choice, TokenOutput | GenerationResult | Exception)`` as they arrive.

        One choice is read straight from its handle. Several are pumped into one queue by a task
        each, and a list is everything the queue holds when the consumer looks.
        """
        if len(self._running) == 1:
            only = self._running[0]
            try:
                async for out in only.handle:
                    yield [(only, out)]
                yield [(only, await only.handle.result())]
            except Exception as exc:  # reported as the choice's failure
                yield [(only, exc)]
            return
        queue: asyncio.Queue[tuple[_Running, object]] = asyncio.Queue()

        async def pump(running: _Running) -> None:
            try:
                async for out in running.handle:
                    queue.put_nowait((running, out))
                queue.put_nowait((running, await running.handle.result()))
            except Exception as exc:
                queue.put_nowait((running, exc))

        tasks = [asyncio.ensure_future(pump(r)) for r in self._running]
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                yield batch
        finally:
            for t in tasks:
                t.cancel()


class CompletionService:
    """Completions on one route: the engine, its adapter and the context one request may use.

    ``limits.max_context`` (the server's ``--max-context``) can lower the engine's context; a
    request that does not fit is refused naming whichever of the two set the limit.
    """

    def __init__(self, route: Route, limits: Limits):
        self.limits = limits
        self.engine: AsyncEngine = route.engine
        self.adapter = route.adapter
        #: The model name responses carry (the adapter's, for an adapter).
        self.served_name = route.served_name
        own = self.engine.info.context_length
        self.context_length = limits.context_length(own)
        self.limit_note = self.engine.context_limit_note if self.context_length == own \
            else "this server's --max-context setting"

    def room_after(self, prompt_ids: Sequence[int]) -> int:
        """How many tokens fit after the prompt (the default ``max_tokens``)."""
        return self.context_length - len(prompt_ids)

    def check_context(self, prompt_ids: Sequence[int], params: GenerationParams) -> None:
        """Refuse a prompt the engine could not serve, or one plus ``max_tokens`` beyond this
        server's context, before anything is submitted (core's one prompt check, with the
        server's ``--max-context`` and its reason)."""
        check_prompt(prompt_ids, params, self.context_length, self.engine.info.vocab_size,
                     limit_note=self.limit_note)

    def choice_params(self, request: RequestInput, prompt_ids: Sequence[int]) -> GenerationParams:
        """The GenerationParams of ``request``'s choices on ``prompt_ids``, refused unless they fit."""
        params = generation_params(request, limits=self.limits, room=self.room_after(prompt_ids),
                                   logprobs_supported=self.engine.capabilities.logprobs)
        self.check_context(prompt_ids, params)
        return params

    async def bad_word_sequences(self, words: Sequence[str] | None) -> tuple[tuple[int, ...], ...]:
        """``GenerationParams.banned_sequences`` of vLLM's ``bad_words``: each word's tokens as
        written at the start of the answer and, where they differ, after a space (vLLM's rule),
        tokenized by the engine once per request."""
        banned: list[tuple[int, ...]] = []
        for i, word in enumerate(words or ()):
            field, text = f"bad_words[{i}]", word.lstrip()
            if not text:
                raise InvalidRequest(field, "must hold a word, not only whitespace", word)
            bare = await self.engine.encode_async(require_encodable(field, text), add_special=False)
            banned.append(tuple(bare))
            spaced = await self.engine.encode_async(" " + text, add_special=False)
            if spaced[0] != bare[0] and len(spaced) == len(bare):
                banned.append(tuple(spaced))
        return tuple(banned)

    async def submit(self, choices: Sequence[ChoiceRequest], *, id_prefix: str, priority: int = 0,
                     cache_salt: str | None = None, prediction: Sequence[int] = ()) -> Submission:
        """Submit every choice under the route's adapter; if one is refused, cancel those already
        accepted and raise the refusal. ``priority``, ``cache_salt`` and ``prediction`` (a
        predicted output's ids, drafted for every choice) are the engine's own (a higher
        priority runs first)."""
        response_id = f"{id_prefix}-{uuid.uuid4().hex[:24]}"
        running: list[_Running] = []
        try:
            for choice in choices:
                params = choice.params if self.adapter is None \
                    else attrs.evolve(choice.params, adapter=self.adapter)
                # Only a grammar needs the keyword: an engine that takes no processors still serves the rest.
                extra: dict[str, Any] = {"logits_processors": choice.processors} if choice.processors else {}
                if prediction:
                    extra["prediction"] = prediction
                handle = await self.engine.submit(choice.prompt_ids, params,
                                                  request_id=f"{response_id}-{choice.index}",
                                                  priority=priority, cache_salt=cache_salt, **extra)
                running.append(_Running(choice.index, handle))
        except BaseException:
            for r in running:
                r.handle.cancel()
            raise
        return Submission(response_id, running)
