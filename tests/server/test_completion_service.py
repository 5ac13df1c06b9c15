"""The completion service alone, without HTTP: submission, refusal, streaming, disconnects.

Where an engine's behaviour matters (what a stream carries, what a cancel does to a running
request) the tests run the real ServingEngine on llamacpp and the embedded model: the session
server's engine, wrapped in a spy that only records the handles it gives out. A fake engine is
used for lifecycle logic alone (what is submitted, in which order, what is cancelled when a
choice fails), where its scripted handles make the order of events exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import pytest
from ruvllm.errors import BackendError, ContextLengthExceeded, InvalidRequest
from ruvllm.server.http.field_names import FieldNames
from ruvllm.server.http.sse import SSEResponse
from ruvllm.server.lifecycle.completion_service import ChoiceRequest, CompletionService, Submission
from ruvllm.server.lifecycle.model_pool import Route
from ruvllm.server.lifecycle.params import Limits
from ruvllm.server.openai.delivery import sse_chunks
from ruvllm.server.openai.formatters import ChatFormatter
from ruvllm.types import FinishReason, GenerationParams, GenerationResult, Timings, TokenOutput, Usage
from starlette.requests import ClientDisconnect

GREEDY = GenerationParams(max_tokens=8, temperature=0.0, ignore_eos=True)
#: Long enough that it is still running when a test cancels it.
LONG = GenerationParams(max_tokens=400, temperature=0.0, ignore_eos=True)


class Spy:
    """The real engine, recording the request ids it was asked for and the handles it gave."""

    def __init__(self, engine: Any):
        self._engine = engine
        self.asked: list[str] = []
        self.handles: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def submit(self, prompt_ids, params, **kwargs):
        self.asked.append(kwargs["request_id"])
        handle = await self._engine.submit(prompt_ids, params, **kwargs)
        self.handles.append(handle)
        return handle


def service(engine: Any, *, adapter: str | None = None, limits: Limits | None = None) -> CompletionService:
    return CompletionService(Route(engine, adapter, adapter or "m", "m"), limits or Limits())


async def finish_of(handle: Any) -> FinishReason:
    return (await asyncio.wait_for(handle.result(), timeout=120)).finish_reason


@pytest.fixture(scope="module")
def prompt(server) -> list[int]:
    return server.engine.encode("The three primary colours are")


def test_streamed_choices_carry_their_tokens_then_their_results(server, prompt):
    async def run() -> tuple[Submission, list]:
        submission = await service(server.engine).submit(
            [ChoiceRequest(index=i, prompt_ids=prompt, params=GREEDY) for i in range(3)], id_prefix="t")
        return submission, [batch async for batch in submission.stream()]

    submission, batches = asyncio.run(run())
    assert submission.indices == [0, 1, 2]
    assert [b.last for b in batches] == [False] * (len(batches) - 1) + [True]
    tokens: dict[int, list[TokenOutput]] = {0: [], 1: [], 2: []}
    results: dict[int, GenerationResult] = {}
    for batch in batches:
        for index, item in batch.items:
            assert index not in results, "nothing of a choice arrives after its result"
            if isinstance(item, TokenOutput):
                tokens[index].append(item)
            else:
                assert isinstance(item, GenerationResult)
                results[index] = item
    assert set(results) == {0, 1, 2}
    for index, result in results.items():
        assert result.finish_reason is FinishReason.LENGTH
        assert "".join(t.text for t in tokens[index]) == result.text
        assert tuple(t.token_id for t in tokens[index] if t.token_id is not None) == result.token_ids
        assert len(result.token_ids) == GREEDY.max_tokens


def test_whole_results_come_in_submission_order(server, prompt):
    # Lengths tell the choices apart on any CPU: sampled tokens of a batch need not match a
    # request run alone (batched numerics), but each choice's own max_tokens is exact.
    lengths = (6, 3, 5)
    params = [GenerationParams(max_tokens=n, temperature=1.0, seed=n, ignore_eos=True) for n in lengths]

    async def run():
        submission = await service(server.engine).submit(
            [ChoiceRequest(index=i, prompt_ids=prompt, params=p) for i, p in enumerate(params)],
            id_prefix="t")
        return await submission.results(_never_gone)

    outcomes = asyncio.run(run())
    assert outcomes is not None
    assert tuple(len(result.token_ids) for _, result in outcomes) == lengths
    for outputs, result in outcomes:
        assert "".join(o.text for o in outputs) == result.text


async def _never_gone() -> bool:
    return False


def test_a_refused_choice_cancels_those_already_accepted_and_stops_submitting(server, prompt):
    spy = Spy(server.engine)
    outside = [server.engine.info.vocab_size]  # a token id the engine refuses at submission

    async def run() -> list[FinishReason]:
        with pytest.raises(InvalidRequest):
            await service(spy).submit([ChoiceRequest(index=0, prompt_ids=prompt, params=LONG),
                                       ChoiceRequest(index=1, prompt_ids=outside, params=LONG),
                                       ChoiceRequest(index=2, prompt_ids=prompt, params=LONG)],
                                      id_prefix="refused")
        return [await finish_of(h) for h in spy.handles]

    finishes = asyncio.run(run())
    assert [rid.rsplit("-", 1)[1] for rid in spy.asked] == ["0", "1"]  # choice 2 never submitted
    assert finishes == [FinishReason.CANCELLED]  # choice 0, accepted before the refusal


def test_a_client_that_leaves_cancels_every_choice(server, prompt):
    spy = Spy(server.engine)
    polls = 0

    async def gone_on_second_look() -> bool:
        nonlocal polls
        polls += 1
        return polls > 1

    async def run():
        submission = await service(spy).submit(
            [ChoiceRequest(index=i, prompt_ids=prompt, params=LONG) for i in range(2)], id_prefix="t")
        outcome = await submission.results(gone_on_second_look, poll_seconds=0.05)
        return outcome, [await asyncio.wait_for(h.result(), 120) for h in spy.handles]

    outcome, results = asyncio.run(run())
    assert outcome is None
    assert [r.finish_reason for r in results] == [FinishReason.CANCELLED] * 2
    assert all(r.usage.completion_tokens < LONG.max_tokens for r in results)


def test_closing_a_stream_early_cancels_the_unfinished_choices(server, prompt):
    spy = Spy(server.engine)

    async def run() -> list[FinishReason]:
        submission = await service(spy).submit(
            [ChoiceRequest(index=i, prompt_ids=prompt, params=LONG) for i in range(2)], id_prefix="t")
        batches = submission.stream()
        first = await batches.__anext__()
        assert first.items and not first.last
        await batches.aclose()
        return [await finish_of(h) for h in spy.handles]

    assert asyncio.run(run()) == [FinishReason.CANCELLED] * 2


def test_a_stream_dropped_before_its_first_write_still_cancels(server, prompt):
    """A client gone before the response started: the body iterator never ran, so only the
    response's close callback can cancel the request."""
    spy = Spy(server.engine)

    async def send(message: dict) -> None:
        raise OSError("connection reset by peer")

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def run() -> FinishReason:
        submission = await service(spy).submit([ChoiceRequest(index=0, prompt_ids=prompt, params=LONG)],
                                               id_prefix="t")
        fmt = ChatFormatter(submission.id, "m", server.engine.tokenizer, None)
        response = SSEResponse(sse_chunks(submission, fmt, include_usage=False, prompt_lengths=[len(prompt)],
                                          names=FieldNames.of({})), on_close=submission.cancel)
        with pytest.raises(ClientDisconnect):
            await response({"type": "http", "asgi": {"spec_version": "2.4"}}, receive, send)
        return await finish_of(spy.handles[0])

    assert asyncio.run(run()) is FinishReason.CANCELLED


def test_the_context_a_request_may_use_and_who_set_it(server, prompt):
    engine = server.engine
    own = service(engine)
    assert own.context_length == engine.info.context_length
    assert own.room_after(prompt) == engine.info.context_length - len(prompt)
    capped = service(engine, limits=Limits(max_context=len(prompt) + 4))
    capped.check_context(prompt, GenerationParams(max_tokens=4))
    with pytest.raises(ContextLengthExceeded, match="--max-context"):
        capped.check_context(prompt, GenerationParams(max_tokens=5))


# ----------------------------------------------------------------- lifecycle logic, fake engine


class FakeHandle:
    """A scripted request: its outputs are ready at once; ``hang`` keeps it running until
    cancelled; ``fail`` ends it with the engine's error result."""

    def __init__(self, request_id: str, outputs: list[TokenOutput], *, hang: bool = False,
                 fail: bool = False):
        self.request_id = request_id
        self._outputs = outputs
        self._hang = hang
        self._fail = fail
        self._cancelled = asyncio.Event()

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    async def __aiter__(self) -> AsyncIterator[TokenOutput]:
        for out in self._outputs:
            yield out
        if self._hang:
            await self._cancelled.wait()

    async def result(self) -> GenerationResult:
        reason = FinishReason.CANCELLED if self.cancelled else \
            FinishReason.ERROR if self._fail else FinishReason.STOP
        text = "".join(o.text for o in self._outputs)
        return GenerationResult(text=text, token_ids=tuple(o.token_id for o in self._outputs),
                                finish_reason=reason, timings=Timings(),
                                usage=Usage(prompt_tokens=1, completion_tokens=len(text)))

    def cancel(self) -> None:
        self._cancelled.set()


class FakeEngine:
    """Hands out scripted handles; ``refuse`` holds the choice indices it refuses."""

    info = SimpleNamespace(context_length=64)
    context_limit_note = ""

    def __init__(self, script: dict[int, dict[str, Any]] | None = None, refuse: tuple[int, ...] = ()):
        self.script = script or {}
        self.refuse = refuse
        self.submitted: list[tuple[str, GenerationParams, dict[str, Any]]] = []
        self.handles: dict[int, FakeHandle] = {}

    async def submit(self, prompt_ids, params, *, request_id, **kwargs) -> FakeHandle:
        index = int(request_id.rsplit("-", 1)[1])
        self.submitted.append((request_id, params, kwargs))
        if index in self.refuse:
            raise InvalidRequest("prompt", f"choice {index} refused")
        script = self.script.get(index, {})
        texts = script.get("texts", ["a", "b"])
        outputs = [TokenOutput(index=k, token_id=k, text=t) for k, t in enumerate(texts)]
        handle = FakeHandle(request_id, outputs, hang=script.get("hang", False),
                            fail=script.get("fail", False))
        self.handles[index] = handle
        return handle


def _choices(n: int, **kwargs: Any) -> list[ChoiceRequest]:
    return [ChoiceRequest(index=i, prompt_ids=[1, 2], params=GenerationParams(max_tokens=4), **kwargs)
            for i in range(n)]


def test_refusal_cancels_every_accepted_choice_in_order_and_submits_no_more():
    engine = FakeEngine(refuse=(2,))

    async def run() -> None:
        with pytest.raises(InvalidRequest, match="choice 2 refused"):
            await service(engine).submit(_choices(4), id_prefix="x")

    asyncio.run(run())
    assert [rid.rsplit("-", 1)[1] for rid, _, _ in engine.submitted] == ["0", "1", "2"]
    assert [engine.handles[i].cancelled for i in (0, 1)] == [True, True]
    assert 3 not in engine.handles


def test_route_adapter_scheduling_and_processors_reach_the_engine():
    engine = FakeEngine()

    def grammar(ids, logits):
        return logits

    params = GenerationParams(max_tokens=2)
    choices = [ChoiceRequest(index=0, prompt_ids=[1], params=params),
               ChoiceRequest(index=1, prompt_ids=[1], params=params, processors=[grammar])]

    async def run() -> Submission:
        return await service(engine, adapter="sql").submit(choices, id_prefix="chatcmpl", priority=-3,
                                                          cache_salt="salt")

    submission = asyncio.run(run())
    assert submission.id.startswith("chatcmpl-")
    assert [rid for rid, _, _ in engine.submitted] == [f"{submission.id}-0", f"{submission.id}-1"]
    assert all(p.adapter == "sql" for _, p, _ in engine.submitted)
    # The processors keyword goes only with a grammar: an engine without it serves the rest.
    assert [kw for _, _, kw in engine.submitted] == [
        {"priority": -3, "cache_salt": "salt"},
        {"priority": -3, "cache_salt": "salt", "logits_processors": [grammar]}]


def test_outputs_ready_together_leave_in_one_batch():
    engine = FakeEngine({0: {"texts": ["a", "b"]}, 1: {"texts": ["c"]}})

    async def run() -> list:
        submission = await service(engine).submit(_choices(2), id_prefix="x")
        return [batch async for batch in submission.stream()]

    (batch,) = asyncio.run(run())
    assert batch.last
    assert [(i, type(item).__name__) for i, item in batch.items] == [
        (0, "TokenOutput"), (0, "TokenOutput"), (0, "GenerationResult"),
        (1, "TokenOutput"), (1, "GenerationResult")]


def test_a_failed_choice_ends_the_stream_and_cancels_the_others():
    engine = FakeEngine({0: {"fail": True}, 1: {"hang": True}})

    async def run() -> list:
        submission = await service(engine).submit(_choices(2), id_prefix="x")
        return [batch async for batch in submission.stream()]

    batches = asyncio.run(run())
    assert batches[-1].last
    index, failure = batches[-1].items[-1]
    assert index == 0 and isinstance(failure, BackendError) and "failed in the engine" in str(failure)
    assert engine.handles[1].cancelled


def test_a_failed_choice_fails_the_whole_answer_and_cancels_the_others():
    engine = FakeEngine({0: {"hang": True}, 1: {"fail": True}})

    async def run() -> None:
        submission = await service(engine).submit(_choices(2), id_prefix="x")
        with pytest.raises(BackendError, match=r"x-[0-9a-f]+-1 failed in the engine"):
            await submission.results(_never_gone)

    asyncio.run(run())
    assert engine.handles[0].cancelled
