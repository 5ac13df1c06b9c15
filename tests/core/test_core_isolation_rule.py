"""The near-tie rule the conformance suite judges batched isolation by (ruvllm.testing.isolation)."""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm.sampling import Sampler
from ruvllm.testing.isolation import NearTieRule, TeacherForcer, top2_margin
from ruvllm.types import GenerationParams

RULE = NearTieRule(margin_bound=0.5, distance_bound=1.0)


def row(*values: float) -> np.ndarray:
    return np.array(values, dtype=np.float32)


def test_same_top_token_is_no_divergence():
    assert RULE.compare_row(0, row(1, 3, 2), row(1.5, 3.2, 2)) is None


def test_near_tie_flipped_by_rounding_is_allowed():
    d = RULE.compare_row(3, row(0, 2.0, 1.9), row(0, 1.95, 1.97))
    assert d is not None and d.allowed
    assert (d.position, d.reference_token, d.other_token) == (3, 1, 2)
    assert d.reference_margin == pytest.approx(0.1, abs=1e-6)


def test_flip_far_from_a_tie_fails_and_says_why():
    d = RULE.compare_row(7, row(0, 4.0, 1.0), row(0, 4.0, 4.5))
    assert d is not None and not d.allowed
    text = d.describe(lambda t: f"tok{t}")
    assert "position 7" in text and "NOT a near-tie" in text
    assert "batched chose 2 'tok2', solo 1 'tok1'" in text and "solo top-2 margin 3.000" in text


def test_near_tie_with_rows_far_apart_fails():
    """A tie in the solo row is no excuse when the batched row is a different computation."""
    d = RULE.compare_row(0, row(0, 2.0, 1.9, 0), row(0, 1.0, 1.9, 5.0))
    assert d is not None and not d.allowed and d.distance == pytest.approx(5.0)


def test_compare_uses_the_reference_tokens_and_checks_alignment():
    ref = [row(0, 2, 1), row(3, 0, 0)]
    other = [row(0, 2, 1), row(0, 0, 3)]
    found = RULE.compare([1, 0], ref, other)
    assert [(d.position, d.allowed) for d in found] == [(1, False)]
    with pytest.raises(ValueError, match="not aligned"):
        RULE.compare([1], ref, other)


def test_top2_margin():
    assert top2_margin(row(1, 3, 2), 1) == pytest.approx(1.0)
    assert top2_margin(row(1, 3, 2), 2) == pytest.approx(-1.0)


def test_teacher_forcer_forces_greedy_and_sampled_choices_and_records_model_rows():
    logits = np.linspace(0, 1, 50, dtype=np.float32)
    for params in (GenerationParams(), GenerationParams(temperature=1.0, seed=3, logprobs=1)):
        forcer = TeacherForcer([7, 3, 11])
        sampler = Sampler(params, 50, logits_processors=[forcer])
        picked = [sampler.sample(logits) for _ in range(3)]
        assert [t.token_id for t in picked] == [7, 3, 11]
        assert all(np.array_equal(r, logits) for r in forcer.rows)
        if params.logprobs is not None:
            # Logprobs report the model's distribution, not the forced one.
            assert picked[0].logprob == pytest.approx(float(logits[7] - np.log(np.exp(logits).sum())))
