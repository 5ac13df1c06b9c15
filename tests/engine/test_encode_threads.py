"""Where the engine tokenizes: on the model thread between two steps by default, on the caller's
thread (short prompts) or a worker thread (long ones) when the tokenizer is ``thread_safe``,
so a request arriving mid-step is tokenized without waiting for the step (engine logic only,
on the fake model)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from engine_fakes import FakeBackend, FakeTokenizer, PagedFakeExecutor
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.engine.engine import INLINE_ENCODE_CHARS
from ruvllm.errors import EngineClosed


class RecordingTokenizer(FakeTokenizer):
    def __init__(self, thread_safe: bool):
        self.thread_safe = thread_safe
        self.threads: list[str] = []

    def encode(self, text, **kw):
        self.threads.append(threading.current_thread().name)
        return super().encode(text, **kw)


class SlowStepExecutor(PagedFakeExecutor):
    """Each forward pass takes ``step_s`` seconds (a busy model thread)."""

    step_s = 0.0

    def execute(self, batch):
        time.sleep(self.step_s)
        return super().execute(batch)


class TokenizerBackend(FakeBackend):
    def __init__(self, executor, tok: RecordingTokenizer):
        super().__init__(executor)
        self._tok = tok

    @property
    def tokenizer(self) -> RecordingTokenizer:
        return self._tok


def make_engine(thread_safe: bool) -> tuple[ServingEngine, RecordingTokenizer, SlowStepExecutor]:
    tok = RecordingTokenizer(thread_safe)
    executor = SlowStepExecutor(num_blocks=64, block_size=4)
    engine = ServingEngine(TokenizerBackend(executor, tok), EngineOptions(block_size=4, max_num_seqs=4))
    return engine, tok, executor


@pytest.mark.parametrize("thread_safe", [False, True])
def test_which_thread_tokenizes(thread_safe):
    engine, tok, _ = make_engine(thread_safe)
    with engine:
        async def run():
            short = await engine.encode_async("abc")
            long = await engine.encode_async("x" * (INLINE_ENCODE_CHARS + 1))
            return short, long

        short, long = asyncio.run(run())
        sync = engine.encode("abc")
    assert short == sync == FakeTokenizer().encode("abc") and len(long) == INLINE_ENCODE_CHARS + 1
    caller = threading.current_thread().name
    if thread_safe:
        assert tok.threads[0] == caller and tok.threads[2] == caller
        assert tok.threads[1] not in (caller, "ruvllm-model")
    else:
        assert tok.threads == ["ruvllm-model"] * 3


@pytest.mark.parametrize("thread_safe", [False, True])
def test_a_thread_safe_tokenizer_does_not_wait_for_a_step(thread_safe):
    """While a request's 0.3 s steps run, a prompt is tokenized at once only off the model thread."""
    from ruvllm.types import GenerationParams

    engine, _, executor = make_engine(thread_safe)
    with engine:
        executor.step_s = 0.3
        handle = engine.submit_sync([1, 2, 3], GenerationParams(max_tokens=3, ignore_eos=True))
        time.sleep(0.05)  # the first step is running

        async def timed():
            start = time.perf_counter()
            await engine.encode_async("hello")
            return time.perf_counter() - start

        took = asyncio.run(timed())
        handle.result()
    assert (took < 0.1) if thread_safe else (took > 0.15)


def test_a_closed_engine_refuses_to_tokenize():
    engine, _, _ = make_engine(True)
    engine.close()
    with pytest.raises(EngineClosed):
        engine.encode("abc")
    with pytest.raises(EngineClosed):
        asyncio.run(engine.encode_async("abc"))
