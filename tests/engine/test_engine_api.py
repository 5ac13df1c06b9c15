"""ServingEngine API and lifecycle on the fake model (engine logic only; the real model is
exercised in test_engine_llamacpp.py and the conformance suite)."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
from engine_fakes import FakeBackend, PagedFakeExecutor, PerSeqFakeExecutor, reference_greedy
from ruvllm.engine import EngineOptions, RequestTimedOut, ServingEngine
from ruvllm.errors import BackendError, ContextLengthExceeded, EngineOptionError, InvalidRequest, Overloaded
from ruvllm.types import FinishReason, GenerationParams

P = [[1, 2, 3, 4, 5], [7, 7, 7], [11, 3, 9, 30, 2, 2, 8, 1, 5]]


def expected(prompt, n):
    toks = reference_greedy(prompt, n)
    return toks


@pytest.fixture
def engine():
    eng = ServingEngine(FakeBackend(PagedFakeExecutor(num_blocks=64, block_size=4)),
                        EngineOptions(block_size=4, max_num_seqs=4))
    yield eng
    eng.close()


def test_generate_sync_batches_and_matches_reference(engine):
    params = GenerationParams(max_tokens=10)
    results = engine.generate_sync(P, params)
    assert engine.path == "executor"
    for p, r in zip(P, results, strict=True):
        assert list(r.token_ids) == expected(p, 10)
        assert r.finish_reason in (FinishReason.LENGTH, FinishReason.STOP)
        assert r.usage.prompt_tokens == len(p)
    m = engine.metrics()
    assert m.running == 0 and m.waiting == 0 and m.kv_usage == 0.0
    assert m.generation_tokens == sum(len(r.token_ids) for r in results)
    assert m.time_to_first_token.count == 3 and m.e2e_latency.count == 3 and m.queue_time.count == 3


def test_async_submit_streams_tokens_and_result():
    async def main():
        eng = ServingEngine(FakeBackend(), EngineOptions(block_size=4))
        try:
            handle = await eng.submit(P[0], GenerationParams(max_tokens=8), request_id="abc")
            assert handle.request_id == "abc"
            streamed = [o async for o in handle]
            result = await handle.result()
            assert [o.token_id for o in streamed if o.token_id is not None] == list(result.token_ids)
            assert "".join(o.text for o in streamed) == result.text
            assert result.timings.time_to_first_token > 0
        finally:
            await eng.shutdown()

    asyncio.run(main())


class _HoldingExecutor(PagedFakeExecutor):
    """Holds the model thread at its 5th step until released, so a cancel sent after the 3rd
    token is sure to arrive while the request still runs (the fake model is fast enough to
    finish 300 tokens before a busy event loop reads the 3rd)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.release = threading.Event()

    def execute(self, batch):
        if len(self.steps) == 4:
            assert self.release.wait(30), "the test never released the model thread"
        return super().execute(batch)


def test_cancel_mid_stream_frees_blocks_and_reports_cancelled():
    ex = _HoldingExecutor(num_blocks=128, block_size=4)

    async def main():
        eng = ServingEngine(FakeBackend(ex, context_length=400), EngineOptions(block_size=4))
        try:
            params = GenerationParams(max_tokens=300, ignore_eos=True)
            handle = await eng.submit(P[2], params)
            seen = 0
            async for _ in handle:
                seen += 1
                if seen == 3:
                    handle.cancel()
                    ex.release.set()
            result = await handle.result()
            assert result.finish_reason is FinishReason.CANCELLED
            assert 3 <= len(result.token_ids) <= 6
            assert eng.metrics().kv_usage == 0.0
            assert eng.metrics().requests_finished.get("cancelled") == 1
        finally:
            await eng.shutdown()

    asyncio.run(main())


def test_bad_requests_fail_at_submit_with_typed_errors(engine):
    with pytest.raises(InvalidRequest, match="prompt"):
        engine.submit_sync([], GenerationParams())
    with pytest.raises(InvalidRequest, match="vocabulary"):
        engine.submit_sync([999], GenerationParams())
    with pytest.raises(ContextLengthExceeded):
        engine.submit_sync([1, 2], GenerationParams(max_tokens=10_000))
    with pytest.raises(InvalidRequest, match="priority"):
        engine.submit_sync([1, 2], GenerationParams(), priority="high")
    h = engine.submit_sync([1, 2], GenerationParams(max_tokens=200, ignore_eos=True), request_id="dup")
    with pytest.raises(InvalidRequest, match="request_id"):
        engine.submit_sync([1, 2], GenerationParams(max_tokens=4), request_id="dup")
    h.cancel()
    assert h.result(timeout=10).finish_reason is FinishReason.CANCELLED


def test_context_length_reflects_kv_capacity():
    # 16 blocks x 4 tokens: one request can never need more than 64 positions.
    eng = ServingEngine(FakeBackend(PagedFakeExecutor(num_blocks=16, block_size=4)),
                        EngineOptions(block_size=4, watermark=0.0))
    try:
        assert eng.info.context_length == 64
        with pytest.raises(ContextLengthExceeded):
            eng.submit_sync([1] * 10, GenerationParams(max_tokens=60))
    finally:
        eng.close()


def test_full_queue_rejects_with_overloaded():
    gate = threading.Event()
    backend = FakeBackend(PagedFakeExecutor(num_blocks=64, block_size=4))
    eng = ServingEngine(backend, EngineOptions(block_size=4, max_queue=2))
    try:
        eng.call_future(gate.wait)  # hold the model thread so requests stay queued
        hs = [eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=2)) for _ in range(2)]
        with pytest.raises(Overloaded) as err:
            eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=2))
        assert err.value.http_status == 503
        assert eng.metrics().waiting == 2
        gate.set()
        for h in hs:
            h.result(timeout=10)
        eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=2)).result(timeout=10)
    finally:
        gate.set()
        eng.close()


def test_request_timeout_ends_the_request_with_a_typed_error():
    eng = ServingEngine(FakeBackend(PagedFakeExecutor(num_blocks=64, block_size=4), context_length=10_000),
                        EngineOptions(block_size=4, num_blocks=64))
    slow = threading.Event()
    try:
        eng.call_future(lambda: slow.wait(0.3))  # the request cannot even start in time
        h = eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=50), timeout=0.1)
        with pytest.raises(RequestTimedOut) as err:
            h.result(timeout=10)
        assert err.value.partial is not None
        assert eng.metrics().requests_finished.get("timeout") == 1
        assert eng.metrics().kv_usage == 0.0
    finally:
        eng.close()


def test_executor_failure_fails_the_step_requests_and_frees_blocks():
    ex = PagedFakeExecutor(num_blocks=64, block_size=4)
    eng = ServingEngine(FakeBackend(ex), EngineOptions(block_size=4))
    try:
        ex.fail_next = True
        h = eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=5))
        with pytest.raises(BackendError, match="injected"):
            h.result(timeout=10)
        assert eng.metrics().kv_usage == 0.0
        # The engine keeps serving.
        again = eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=5)).result(timeout=10)
        assert len(again.token_ids) >= 1
    finally:
        eng.close()


def test_preemption_under_kv_pressure_keeps_outputs_and_counts():
    ex = PerSeqFakeExecutor(num_blocks=14, block_size=4, max_sequences=6)
    eng = ServingEngine(FakeBackend(ex, context_length=60), EngineOptions(block_size=4, watermark=0.0))
    try:
        ps = [[i, i + 1, i + 2, 5, 6, 7, 8, 9] for i in range(6)]
        results = eng.generate_sync(ps, GenerationParams(max_tokens=16))
        for p, r in zip(ps, results, strict=True):
            assert list(r.token_ids) == reference_greedy(p, 16)
        assert eng.metrics().preemptions > 0
        assert eng.metrics().kv_usage == 0.0
    finally:
        eng.close()


def test_prefix_cache_hits_are_counted_and_harmless(engine):
    shared = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9]
    first = engine.generate_sync([[*shared, 1]], GenerationParams(max_tokens=6))[0]
    second = engine.generate_sync([[*shared, 1]], GenerationParams(max_tokens=6))[0]
    assert first.token_ids == second.token_ids
    m = engine.metrics()
    assert m.prefix_cache_hits >= 12 and 0 < m.prefix_cache_hit_rate < 1


@pytest.mark.parametrize("concurrent", [False, True])
def test_request_level_path_for_backends_without_executor(concurrent):
    backend = FakeBackend(executor_capable=False, concurrent=concurrent)
    eng = ServingEngine(backend, EngineOptions(max_in_flight=3))
    try:
        assert eng.path == "request"
        results = eng.generate_sync(P, GenerationParams(max_tokens=7))
        for p, r in zip(P, results, strict=True):
            assert list(r.token_ids) == expected(p, 7)
        assert backend.generate_calls == 3
    finally:
        eng.close()


def test_shutdown_cancels_outstanding_requests_and_closes_owned_backend():
    backend = FakeBackend(PagedFakeExecutor(num_blocks=2000, block_size=4), context_length=10_000)
    eng = ServingEngine(lambda: backend, EngineOptions(block_size=4))
    h = eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=5000, ignore_eos=True))
    time.sleep(0.05)
    eng.close()
    assert h.result(timeout=10).finish_reason is FinishReason.CANCELLED
    assert backend.closed


def test_options_validate_by_name():
    with pytest.raises(EngineOptionError, match="policy"):
        EngineOptions(policy="random")
    with pytest.raises(EngineOptionError, match="max_num_seqs"):
        EngineOptions(max_num_seqs=0)
    with pytest.raises(EngineOptionError, match="bogus"):
        EngineOptions.from_mapping({"bogus": 1})
    with pytest.raises(EngineOptionError, match="path"):
        ServingEngine(FakeBackend(executor_capable=False), EngineOptions(path="executor"))


def test_stop_token_ends_with_stop_and_its_reason():
    eng = ServingEngine(FakeBackend(), EngineOptions(block_size=4))
    try:
        p = [5, 6, 7]
        ref = reference_greedy(p, 30)
        stop_id = ref[4]
        cut = ref.index(stop_id) + 1
        r = eng.generate_sync([p], GenerationParams(max_tokens=30, stop_token_ids=[stop_id]))[0]
        assert r.finish_reason is FinishReason.STOP and r.stop_reason == stop_id
        assert list(r.token_ids) == ref[:cut]
    finally:
        eng.close()


class _ShortLogits(PagedFakeExecutor):
    """Returns one logits row too few once: a broken executor contract, caught outside
    execute() (while sampling)."""

    broken = True

    def execute(self, batch):
        rows = super().execute(batch)
        if self.broken:
            self.broken = False
            return rows[:0]
        return rows


def test_unexpected_step_failure_fails_requests_and_engine_survives():
    ex = _ShortLogits(num_blocks=64, block_size=4)
    eng = ServingEngine(FakeBackend(ex), EngineOptions(block_size=4))
    try:
        h = eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=5))
        with pytest.raises(BackendError, match="engine step failed"):
            h.result(timeout=10)
        assert eng.metrics().kv_usage == 0.0
        ok = eng.submit_sync([1, 2, 3], GenerationParams(max_tokens=5)).result(timeout=10)
        assert list(ok.token_ids) == reference_greedy([1, 2, 3], 5)
    finally:
        eng.close()


def test_logits_processors_steer_each_request_alone(engine):
    """A processor sees the request's own output so far and only its row: forcing one request's
    tokens leaves a request batched with it untouched."""
    from ruvllm.testing.isolation import TeacherForcer

    forced = [5, 6, 7, 8]
    forcer = TeacherForcer(forced)
    params = GenerationParams(max_tokens=4, ignore_eos=True)
    steered = engine.submit_sync(P[0], params, logits_processors=[forcer])
    plain = engine.submit_sync(P[1], params)
    assert list(steered.result().token_ids) == forced
    assert list(plain.result().token_ids) == expected(P[1], 4)
    assert len(forcer.rows) == 4  # the model's own rows were recorded before forcing


def test_logits_processors_need_the_executor_path():
    eng = ServingEngine(FakeBackend(executor_capable=False), EngineOptions())
    try:
        with pytest.raises(InvalidRequest, match="logits_processors"):
            eng.submit_sync(P[0], GenerationParams(max_tokens=2), logits_processors=[lambda ids, row: row])
    finally:
        eng.close()


class _SizeRecorder(FakeBackend):
    """Records the sequence count the engine asks its executor for."""

    asked: list[int]

    def create_executor(self, *, max_sequences: int, block_size: int):
        self.asked = [*getattr(self, "asked", []), max_sequences]
        return super().create_executor(max_sequences=max_sequences, block_size=block_size)


class _PerSequenceSizeRecorder(_SizeRecorder):
    executor_kv_layout = "per_sequence"

    def create_executor(self, *, max_sequences: int, block_size: int):
        self.asked = [*getattr(self, "asked", []), max_sequences]
        return PerSeqFakeExecutor(max_sequences=max_sequences, block_size=block_size)


@pytest.mark.parametrize(("backend_cls", "donors_asked"), [(_SizeRecorder, 0), (_PerSequenceSizeRecorder, 2)])
def test_prefix_donor_sequences_only_for_per_sequence_executors(backend_cls, donors_asked):
    """Donor sequences keep cached prefixes alive where KV lives per sequence id; a paged
    executor shares prefixes by block, so asking it for them would only size memory (a two-tier
    hot window each, say) for sequences that never run."""
    backend = backend_cls()
    with ServingEngine(backend, EngineOptions(max_num_seqs=3, prefix_donor_slots=2, block_size=4)) as eng:
        assert eng.generate_sync([[1, 2, 3]], GenerationParams(max_tokens=2))[0].token_ids
    assert backend.asked == [3 + donors_asked]


class _ManyDonorsRecorder(_PerSequenceSizeRecorder):
    prefix_donor_slots = 7


class _CappedRecorder(_PerSequenceSizeRecorder):
    max_executor_sequences = 8


@pytest.mark.parametrize(("backend_cls", "setting", "donors_asked"),
                         [(_PerSequenceSizeRecorder, "auto", 16), (_ManyDonorsRecorder, "auto", 7),
                          (_ManyDonorsRecorder, 5, 5), (_ManyDonorsRecorder, 0, 0),
                          (_CappedRecorder, "auto", 5), (_CappedRecorder, 9, 9)])
def test_auto_donor_count_is_the_backends_own(backend_cls, setting, donors_asked):
    """``prefix_donor_slots = "auto"`` (the default) takes the backend's count: llama.cpp parks
    donors in host memory and keeps more, MLX holds them in its pool and keeps the base's 16;
    it shrinks to what the executor holds beside ``max_num_seqs`` (llama.cpp: 256), so a large
    ``max_num_seqs`` still starts; a number overrides it, as given."""
    backend = backend_cls()
    options = EngineOptions(max_num_seqs=3, prefix_donor_slots=setting, block_size=4)
    with ServingEngine(backend, options) as eng:
        assert eng.generate_sync([[1, 2, 3]], GenerationParams(max_tokens=2))[0].token_ids
    assert backend.asked == [3 + donors_asked]


@pytest.mark.parametrize("bad", [-1, "many", 2.5, True])
def test_donor_count_refuses_what_is_not_auto_or_a_count(bad):
    with pytest.raises(EngineOptionError, match="prefix_donor_slots"):
        EngineOptions(prefix_donor_slots=bad)


def test_the_engine_offers_everything_the_async_engine_contract_names(engine):
    from ruvllm.serving import contract_members, missing_members

    # The server reads these by name (no getattr probing): the contract must stay complete.
    assert {"scheduling_policy", "guided_decoding_backend", "context_limit_note", "memory_summary",
            "adapters", "feedback", "path"} <= contract_members()
    assert missing_members(engine) == []
    assert engine.scheduling_policy == "fcfs" and engine.adapters() is None
