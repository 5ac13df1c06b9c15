"""The ServingEngine on each backend: isolation under concurrency, KV accounting, prefix cache,
priority.

These run the backend's model through :class:`ruvllm.engine.ServingEngine`: through its
iteration-level executor when the backend has one (``capabilities().executor``), else through
the request-level path. Tests about KV blocks need the executor path and skip without it.

Isolation under batching: a backend whose capabilities declare ``batch_invariant`` (and any
backend served request by request, which never batches) must give, at temperature 0, exactly
the tokens each prompt gives alone. Every other executor backend is judged by the near-tie rule
of :mod:`ruvllm.testing.isolation`: the batched run is teacher-forced on the solo tokens, and a
position may pick another token only where the solo run's top-2 margin is under
``MARGIN_BOUND`` and the batched logits stay within ``DISTANCE_BOUND`` of the solo ones. A KV
leak moves logits by whole logits and fails it; batch-size-dependent kernels (llama.cpp on AVX2,
bf16 blocking) do not.
"""

from __future__ import annotations

import asyncio
import threading

import attrs
import pytest

from ruvllm.engine import ServingEngine
from ruvllm.errors import ContextLengthExceeded, InvalidRequest
from ruvllm.llm import LLM
from ruvllm.testing.isolation import LogitsRecorder, NearTieRule, TeacherForcer, max_distance
from ruvllm.testing.support import PROMPT_A, PROMPT_C, report_speculation
from ruvllm.types import FinishReason, GenerationParams

#: Sixteen prompts of different kinds and lengths (the isolation test needs them distinct).
SIXTEEN_PROMPTS = (
    PROMPT_A, PROMPT_C, "Once upon a time", "The three primary colours are",
    "import numpy as np\n", "List of prime numbers: 2, 3, 5,", "Dear Sir or Madam,",
    "The quick brown fox", "In 1969, the first humans", "To bake bread you need",
    "SELECT name FROM", "The mitochondria is", "Water boils at", "My favourite season is",
    "The opposite of hot is", "Translate to French: cheese ->",
)
GREEDY = GenerationParams(max_tokens=16, temperature=0.0)
#: The slot-reuse test: more requests than running slots, each of its own length, so requests
#: finish out of admission order and a freed slot is taken by a later request. The engine's
#: entries then stop coming in sequence-id order (with every request admitted at once, as in the
#: isolation test, they always do).
SLOT_REUSE_SLOTS = 3
#: Twelve of each of the five kinds of the mixed-requests test: every kind meets every other one
#: in the queue, more than 16 slots' worth are in flight at once, and on the slowest CPU backend
#: it takes seconds, not a minute (200 took 77 s on mlx).
MIXED_REQUESTS = 60
SLOT_REUSE_LENGTHS = (9, 3, 7, 2, 6, 4, 8, 5)
#: Tokens of the predicted-output test's answers: several drafts' worth.
PREDICTED_TOKENS = 24
#: The position of the token the predicted-output test edits.
PREDICTION_EDIT = 8


@pytest.fixture(scope="module")
def engine(ruvllm_llm: LLM, ruvllm_engine_options):
    """One engine per backend over the suite's loaded model (the model stays the LLM's).

    Two prefix donors, fewer than the default: a per-sequence executor then hands the sequence
    ids of finished requests to the next ones within a test (16 solo runs, then 16 together), so
    a backend that keeps a freed sequence's KV serves a later request over it and fails."""
    eng = ServingEngine(ruvllm_llm.backend, ruvllm_engine_options(max_num_seqs=16, prefix_donor_slots=2),
                        owns_backend=False)
    try:
        yield eng
        report_speculation(eng, "TestEngine")
    finally:
        eng.close()


def _require_executor(engine: ServingEngine) -> None:
    if engine.path != "executor":
        pytest.skip(f"backend {engine.backend_name!r} has no iteration-level executor: the engine "
                    "serves it request by request and keeps no KV blocks of its own")


def _ids(engine: ServingEngine, text: str) -> list[int]:
    return engine.encode(text)


def _assert_isolated_within_near_ties(engine: ServingEngine, prompts: list[list[int]]) -> None:
    """Solo runs recorded one by one; then all 16 batched, teacher-forced on the solo tokens."""
    solo = []
    for prompt in prompts:
        recorder = LogitsRecorder()
        result = engine.submit_sync(prompt, GREEDY, logits_processors=[recorder]).result()
        solo.append((result, recorder))
    forcers = [TeacherForcer(result.token_ids) for result, _ in solo]
    handles = [
        engine.submit_sync(prompt, attrs.evolve(GREEDY, max_tokens=len(result.token_ids)),
                           logits_processors=[forcer])
        for prompt, (result, _), forcer in zip(prompts, solo, forcers, strict=True)
    ]
    batched = [h.result() for h in handles]
    rule = NearTieRule()
    token_text = engine.tokenizer.token_text
    problems, allowed, widest = [], [], 0.0
    for text, (result, recorder), forcer, forced in zip(SIXTEEN_PROMPTS, solo, forcers, batched, strict=True):
        assert forced.token_ids == result.token_ids, f"prompt {text!r}: teacher forcing did not hold"
        widest = max(widest, max_distance(recorder.rows, forcer.rows))
        for d in rule.compare(result.token_ids, recorder.rows, forcer.rows):
            if d.allowed:
                allowed.append(f"{d.position}: margin {d.reference_margin:.3f}, distance {d.distance:.3f}")
            else:
                problems.append(f"prompt {text!r}: {d.describe(token_text)}")
    print(f"isolation: {len(allowed)} near-tie flips allowed {allowed}, widest batched-vs-solo logit "
          f"distance {widest:.4f} (bounds: margin < {rule.margin_bound}, distance < {rule.distance_bound})")
    assert not problems, "batched sequences diverged from their solo runs beyond rounding:\n" + \
        "\n".join(problems)


def _assert_plain_up_to_near_ties(engine: ServingEngine, text: str, plain, plain_rows: LogitsRecorder,
                                  other, other_rows: LogitsRecorder) -> None:
    """``other`` is ``plain``'s output until a position where plain decoding had a near-tie that
    ``other``'s rows (computed in another batch shape) flipped; from there the contexts differ."""
    rule = NearTieRule()
    for k, (x, y) in enumerate(zip(plain.token_ids, other.token_ids, strict=True)):
        d = rule.compare_row(k, plain_rows.rows[k], other_rows.rows[k], reference_token=x)
        assert d is None or d.allowed, f"prompt {text!r}: {d.describe(engine.tokenizer.token_text)}"
        if x != y:
            return


def _submit_held(engine: ServingEngine, prompts: list[list[int]], params: list[GenerationParams],
                 processors: list[list] | None = None) -> list:
    """Submit every request while the model thread waits, so the scheduler sees them all queued
    in this order, then wait for every result."""
    gate = threading.Event()
    engine.call_future(gate.wait)
    try:
        handles = [engine.submit_sync(p, pa, logits_processors=processors[i] if processors else ())
                   for i, (p, pa) in enumerate(zip(prompts, params, strict=True))]
    finally:
        gate.set()
    return [h.result(timeout=300) for h in handles]


class TestEngine:
    def test_isolation_under_concurrency(self, engine: ServingEngine) -> None:
        """16 distinct prompts submitted at once give, at temperature 0, what each gives alone
        (exactly, or within the near-tie rule where batched numerics legitimately differ):
        batching must not let sequences see each other's KV."""
        prompts = [_ids(engine, p) for p in SIXTEEN_PROMPTS]
        if engine.backend.capabilities().batch_invariant or engine.path != "executor":
            alone = [engine.generate_sync([p], GREEDY)[0] for p in prompts]
            together = engine.generate_sync(prompts, GREEDY)
            for text, a, t in zip(SIXTEEN_PROMPTS, alone, together, strict=True):
                assert t.token_ids == a.token_ids, (
                    f"prompt {text!r}: batched output {t.text!r} != alone {a.text!r} (the backend "
                    "declares batch-invariant numerics, or serves one request at a time)"
                )
        else:
            _assert_isolated_within_near_ties(engine, prompts)
        assert engine.metrics().running == 0

    def test_cancellation_mid_stream_frees_blocks(self, engine: ServingEngine) -> None:
        _require_executor(engine)
        prompt = _ids(engine, PROMPT_A)
        # The model thread waits before its third token until the test has cancelled: without
        # it a fast backend finishes all 64 tokens before the consumer sees its second one.
        cancelled = threading.Event()

        def hold_after_two(generated, logits):
            if len(generated) == 2:
                cancelled.wait(timeout=60)
            return logits

        async def run() -> tuple[int, object]:
            handle = await engine.submit(prompt, GenerationParams(max_tokens=64, ignore_eos=True),
                                         logits_processors=[hold_after_two])
            seen = 0
            async for _ in handle:
                seen += 1
                if seen == 2:
                    assert engine.metrics().kv_usage > 0
                    handle.cancel()
                    cancelled.set()
            return seen, await handle.result()

        seen, result = asyncio.run(run())
        assert seen >= 2
        assert result.finish_reason is FinishReason.CANCELLED
        assert len(result.token_ids) < 64
        assert engine.metrics().kv_usage == 0.0

    def test_mixed_requests_leave_zero_blocks(self, engine: ServingEngine) -> None:
        """MIXED_REQUESTS requests, interleaved: plain, with stop strings, cancelled at once,
        cancelled mid-stream, and over-length (rejected at submit). Afterwards no KV block is
        allocated."""
        _require_executor(engine)
        base = [_ids(engine, p) for p in SIXTEEN_PROMPTS]
        too_long = 0

        async def run() -> list[object]:
            nonlocal too_long
            handles = []
            for i in range(MIXED_REQUESTS):
                kind = i % 5
                prompt = base[i % len(base)]
                if kind == 4:
                    with pytest.raises(ContextLengthExceeded):
                        await engine.submit(prompt, GenerationParams(max_tokens=engine.info.context_length))
                    too_long += 1
                    continue
                params = GenerationParams(max_tokens=4 + i % 5, stop=[" the", "\n"] if kind == 1 else ())
                h = await engine.submit(prompt, params)
                if kind == 2:
                    h.cancel()
                handles.append((kind, h))
            results = []
            for kind, h in handles:
                if kind == 3:
                    async for _ in h:
                        h.cancel()
                        break
                results.append(await h.result())
            return results

        results = asyncio.run(run())
        assert too_long == MIXED_REQUESTS // 5 and len(results) == MIXED_REQUESTS * 4 // 5
        assert any(r.finish_reason is FinishReason.CANCELLED for r in results)
        assert engine.metrics().kv_usage == 0.0
        core = engine._core  # the block manager itself, not just the metric derived from it
        assert core.blocks.num_used_blocks == 0
        core.blocks.check_invariants()

    def test_prefix_cache_hit_equals_miss(self, ruvllm_llm: LLM, ruvllm_engine_options) -> None:
        """A request served from cached prefix blocks gives the tokens a cold one gives."""
        eng = ServingEngine(ruvllm_llm.backend, ruvllm_engine_options(max_num_seqs=4, block_size=16),
                            owns_backend=False)
        try:
            _require_executor(eng)
            if not eng._core.blocks.enable_prefix_caching:
                pytest.skip(f"backend {eng.backend_name!r}'s executor does not support prefix caching")
            system = ("You are a careful assistant. Answer briefly and precisely, and say so when "
                      "you do not know. ") * 3
            prompts = [_ids(eng, system + q) for q in ("What is 2+2?", "Name a colour.")]
            cold = [eng.generate_sync([p], GREEDY)[0] for p in prompts]
            hits_before = eng.metrics().prefix_cache_hits
            warm = [eng.generate_sync([p], GREEDY)[0] for p in prompts]
            assert eng.metrics().prefix_cache_hits - hits_before >= 2 * 16, "no prefix-cache hit"
            for c, w in zip(cold, warm, strict=True):
                assert w.token_ids == c.token_ids, f"cache hit {w.text!r} != miss {c.text!r}"
            # Another tenant (cache salt) must not hit the first tenant's blocks.
            hits = eng.metrics().prefix_cache_hits
            h = eng.submit_sync(prompts[0], GREEDY, cache_salt="tenant-b")
            assert h.result().token_ids == cold[0].token_ids
            assert eng.metrics().prefix_cache_hits == hits
        finally:
            eng.close()

    def test_priority_order_is_honoured(self, ruvllm_llm: LLM, ruvllm_engine_options) -> None:
        """With one running slot, queued requests start in priority order, not arrival order."""
        eng = ServingEngine(ruvllm_llm.backend, ruvllm_engine_options(max_num_seqs=1, max_in_flight=1,
                                                                      policy="priority"), owns_backend=False)
        gate = threading.Event()
        try:
            prompt = _ids(eng, PROMPT_A)
            eng.call_future(gate.wait)  # hold the model thread until everything is queued
            order = ("low", "normal", "high", "critical")
            prios = {"low": -1, "normal": 0, "high": 1, "critical": 2}
            handles = {n: eng.submit_sync(prompt, GenerationParams(max_tokens=2), priority=prios[n])
                       for n in order}
            gate.set()
            started = {n: h.result(timeout=120).timings.queue for n, h in handles.items()}
            assert sorted(order, key=started.__getitem__) == ["critical", "high", "normal", "low"]
        finally:
            gate.set()
            eng.close()

    def test_a_predicted_output_is_verified_not_trusted(self, ruvllm_llm: LLM, ruvllm_engine_options) -> None:
        """OpenAI's Predicted Outputs: the expected answer drafts the request's tokens and the
        request's own sampler verifies them. Predicting the answer plain decoding gives keeps
        most drafts; predicting it with one token edited has that draft rejected (and the rest
        kept once the cursor finds the unchanged text again); either way the output is plain
        decoding's (exactly, or up to near-ties where the
        executor's numerics depend on the batch shape). An engine that trusted drafts writes the
        wrong prediction; an executor that keeps a rejected draft's KV (``trim``) changes what
        follows it. A backend that cannot verify drafts (no executor, or one without logits per
        position) refuses a prediction by name."""
        options = ruvllm_engine_options(max_num_seqs=4, speculative_adaptive=False)
        eng = ServingEngine(ruvllm_llm.backend, options, owns_backend=False)
        try:
            # Verifying drafts needs logits at every drafted position (BatchExecutor.prompt_logits).
            if not getattr(getattr(eng._core, "executor", None), "prompt_logits", False):
                with pytest.raises(InvalidRequest) as err:
                    eng.submit_sync(_ids(eng, PROMPT_A), GREEDY, prediction=[1, 2])
                assert err.value.field == "prediction"
                return
            exact = eng.backend.capabilities().batch_invariant
            params = GenerationParams(max_tokens=PREDICTED_TOKENS, temperature=0.0, ignore_eos=True)
            for text in (PROMPT_A, PROMPT_C):
                prompt = _ids(eng, text)
                plain_rows = LogitsRecorder()
                plain = eng.submit_sync(prompt, params, logits_processors=[plain_rows]).result()
                ids = plain.token_ids
                edited = (*ids[:PREDICTION_EDIT], (ids[PREDICTION_EDIT] + 1) % eng.info.vocab_size,
                          *ids[PREDICTION_EDIT + 1:])
                for prediction, kept in ((ids, True), (edited, False)):
                    rows = LogitsRecorder()
                    out = eng.submit_sync(prompt, params, logits_processors=[rows],
                                          prediction=prediction).result()
                    used = out.usage
                    assert used.accepted_draft_tokens > PREDICTION_EDIT // 2, f"prompt {text!r}: {used}"
                    if not kept:
                        assert used.draft_tokens > used.accepted_draft_tokens, f"prompt {text!r}: {used}"
                    if exact:
                        assert out.token_ids == plain.token_ids, (
                            f"prompt {text!r}, {'right' if kept else 'edited'} prediction: {out.text!r} != "
                            f"plain {plain.text!r}")
                    else:
                        _assert_plain_up_to_near_ties(eng, text, plain, plain_rows, out, rows)
            assert eng.metrics().kv_usage == 0.0
        finally:
            eng.close()

    def test_slot_reuse_keeps_each_request_its_rows(self, ruvllm_llm: LLM, ruvllm_engine_options) -> None:
        """8 requests of different lengths through 3 running slots: as requests finish, freed
        slots go to later requests and a step's entries are no longer in slot order. Every
        request still gets its own logits row and its own KV: its output equals its solo run
        (exactly, or within the near-tie rule, as in the isolation test). An executor that
        returns rows in slot order, or keeps a freed slot's KV, fails."""
        eng = ServingEngine(ruvllm_llm.backend, ruvllm_engine_options(max_num_seqs=SLOT_REUSE_SLOTS),
                            owns_backend=False)
        try:
            texts = SIXTEEN_PROMPTS[: len(SLOT_REUSE_LENGTHS)]
            prompts = [_ids(eng, t) for t in texts]
            params = [GenerationParams(max_tokens=n, temperature=0.0, ignore_eos=True)
                      for n in SLOT_REUSE_LENGTHS]
            exact = eng.backend.capabilities().batch_invariant or eng.path != "executor"
            recorders = [[] if exact else [LogitsRecorder()] for _ in prompts]
            solo = [eng.submit_sync(p, pa, logits_processors=r).result(timeout=300)
                    for p, pa, r in zip(prompts, params, recorders, strict=True)]
            if exact:
                together = _submit_held(eng, prompts, params)
                for text, a, t in zip(texts, solo, together, strict=True):
                    assert t.token_ids == a.token_ids, (
                        f"prompt {text!r}: {t.text!r} with slots reused != alone {a.text!r}")
                return
            forcers = [TeacherForcer(result.token_ids) for result in solo]
            forced = _submit_held(eng, prompts, params, [[f] for f in forcers])
            rule, problems = NearTieRule(), []
            for text, result, [recorder], forcer, out in zip(texts, solo, recorders, forcers, forced,
                                                              strict=True):
                assert out.token_ids == result.token_ids, f"prompt {text!r}: teacher forcing did not hold"
                for d in rule.compare(result.token_ids, recorder.rows, forcer.rows):
                    if not d.allowed:
                        problems.append(f"prompt {text!r}: {d.describe(eng.tokenizer.token_text)}")
            assert not problems, ("with slots reused, requests diverged from their solo runs beyond "
                                  "rounding:\n" + "\n".join(problems))
            assert eng.metrics().running == 0
        finally:
            eng.close()
