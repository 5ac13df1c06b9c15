"""Predicted outputs (OpenAI's ``prediction``): the cursor that drafts from them, and the engine
verifying those drafts on the copying fake model of test_speculative.py, without any
``speculative_method``: the output must be token for token what it is without a prediction."""

from __future__ import annotations

import pytest
from engine_fakes import FakeBackend
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.engine.prediction import PredictionCursor
from ruvllm.engine.request import SchedRequest
from ruvllm.engine.speculative import PROBE_INTERVAL, Speculator
from ruvllm.errors import InvalidRequest
from ruvllm.types import GenerationParams
from test_speculative import PROMPTS, FixedCost, PagedCopying, PerSeqCopying

GREEDY = GenerationParams(max_tokens=40, temperature=0.0, ignore_eos=True)
SAMPLED = GenerationParams(max_tokens=40, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True, logprobs=2)


def test_the_cursor_follows_the_output_through_the_prediction():
    cursor = PredictionCursor([10, 11, 12, 13, 14, 15], min_n=1, max_n=3)
    assert cursor.propose([], 3) == (10, 11, 12)
    assert cursor.propose([10, 11], 3) == (12, 13, 14)
    assert cursor.propose([10, 11, 12, 13, 14, 15], 3) == ()  # the prediction is used up


def test_after_an_edit_the_cursor_resumes_where_the_unchanged_text_does():
    #           0   1   2   3   4   5   6   7
    predicted = [10, 11, 12, 13, 14, 15, 16, 17]
    cursor = PredictionCursor(predicted, min_n=2, max_n=3)
    assert cursor.propose([10, 11], 2) == (12, 13)
    assert cursor.propose([10, 11, 99], 2) == ()  # an edit: nothing predicts what follows 99
    assert cursor.propose([10, 11, 99, 13, 14], 2) == (15, 16)  # "13 14" occurs again: resumed


def test_the_cursor_prefers_the_occurrence_ahead_of_where_it_was():
    #            0  1  2  3  4  5  6  7  8
    predicted = [1, 2, 7, 3, 4, 1, 2, 8, 9]
    cursor = PredictionCursor(predicted, min_n=2, max_n=2)
    assert cursor.propose([1, 2, 7, 3, 4], 1) == (1,)
    assert cursor.propose([1, 2, 7, 3, 4, 5, 1, 2], 1) == (8,)  # not the "1 2" behind (-> 7)


def test_each_prediction_is_sized_by_its_own_acceptance_not_by_other_clients():
    """A client's poor prediction stops its own drafts (but for probes), never another's: each
    predicted request starts from the same optimistic prior."""
    spec = Speculator(num_speculative_tokens=4, prompt_lookup_min=1, prompt_lookup_max=2,
                      disable_by_batch_size=4, lookup=False)
    spec.cost = FixedCost(0.5)
    prompt, predicted = [1, 2, 3], tuple(range(10, 40))

    def request(rid):
        return SchedRequest(rid, [*prompt, 10], max_tokens=100, prediction=predicted)

    bad = request("bad")
    assert len(spec.propose(bad, 16, 1)) == 3  # acceptance 0.8 at first: three tokens are worth it
    for _ in range(30):
        spec.record("bad", 3, 0)
    assert [len(spec.propose(bad, 16, 1)) for _ in range(PROBE_INTERVAL)][-2:] == [0, 1]
    assert len(spec.propose(request("good"), 16, 1)) == 3
    assert spec.propose(SchedRequest("plain", [*prompt, 1, 2, 3], max_tokens=100), 16, 1) == ()  # no lookup


def _run(executor_cls, params, predictions, **options):
    executor = executor_cls(num_blocks=64, block_size=4, max_batch_tokens=64, max_sequences=8)
    with ServingEngine(FakeBackend(executor), EngineOptions(max_num_seqs=4, block_size=4, **options)) as eng:
        handles = [eng.submit_sync(p, params, prediction=pred) for p, pred in zip(PROMPTS, predictions,
                                                                                  strict=True)]
        results = [h.result() for h in handles]
        assert eng.metrics().kv_usage == 0.0
        eng._core.blocks.check_invariants()
    return results


@pytest.mark.parametrize("executor_cls", [PagedCopying, PerSeqCopying])
@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_a_prediction_drafts_and_changes_nothing_in_the_output(executor_cls, params):
    plain = _run(executor_cls, params, [()] * len(PROMPTS))
    assert all(r.usage.draft_tokens == 0 for r in plain)  # no speculative_method: nobody else drafts
    exact = [r.token_ids for r in plain]
    # Each answer predicted with an edit in its middle, so drafts are kept, then rejected, then
    # kept again where the cursor finds the unchanged text.
    edited = [(*ids[:15], 0, 0, *ids[17:]) for ids in exact]
    for predictions in (exact, edited):
        spec = _run(executor_cls, params, predictions, speculative_adaptive=False)
        for a, b in zip(plain, spec, strict=True):
            assert (b.token_ids, b.text, b.logprobs) == (a.token_ids, a.text, a.logprobs)
        assert all(0 < r.usage.accepted_draft_tokens <= r.usage.draft_tokens for r in spec)
    assert all(r.usage.accepted_draft_tokens > 30 for r in _run(executor_cls, params, exact,
                                                                speculative_adaptive=False))


def test_a_backend_that_cannot_verify_drafts_refuses_a_prediction():
    with ServingEngine(FakeBackend(executor_capable=False), EngineOptions()) as eng:
        with pytest.raises(InvalidRequest) as err:
            eng.submit_sync([1, 2, 3], GREEDY, prediction=[4, 5])
        assert err.value.field == "prediction"


def test_a_prediction_outside_the_vocabulary_is_refused():
    executor = PagedCopying(num_blocks=64, block_size=4, max_batch_tokens=64, max_sequences=8)
    with ServingEngine(FakeBackend(executor), EngineOptions(block_size=4)) as eng:
        with pytest.raises(InvalidRequest, match="outside the vocabulary") as err:
            eng.submit_sync([1, 2, 3], GREEDY, prediction=[4, 10**6])
        assert err.value.field == "prediction"
