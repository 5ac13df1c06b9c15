"""``RUVLLM_NEAR_TIE_BOUNDS``: one process's bounds of the isolation rule (a conformance run of a
backend whose quantised KV moves logits further than batching does), refused when malformed."""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm.testing.isolation import BOUNDS_ENV, DISTANCE_BOUND, MARGIN_BOUND, NearTieRule, default_bounds


def _rows(margin: float, distance: float) -> tuple[np.ndarray, np.ndarray]:
    """A reference row whose token 0 leads token 1 by ``margin``, and a row that prefers token 1
    by 0.1 and differs from it by ``distance`` somewhere."""
    ref = np.array([margin, 0.0, -5.0, -5.0], dtype=np.float32)
    other = np.array([0.0, 0.1, -5.0, -5.0 + distance], dtype=np.float32)
    return ref, other


def test_defaults_without_the_variable(monkeypatch):
    monkeypatch.delenv(BOUNDS_ENV, raising=False)
    assert default_bounds() == (MARGIN_BOUND, DISTANCE_BOUND)
    assert NearTieRule() == NearTieRule(MARGIN_BOUND, DISTANCE_BOUND)


def test_the_variable_sets_the_bounds_of_rules_built_without_them(monkeypatch):
    ref, other = _rows(margin=1.0, distance=5.0)
    monkeypatch.delenv(BOUNDS_ENV, raising=False)
    assert not NearTieRule().compare_row(0, ref, other).allowed
    monkeypatch.setenv(BOUNDS_ENV, " 1.5, 9 ")
    rule = NearTieRule()
    assert (rule.margin_bound, rule.distance_bound) == (1.5, 9.0)
    assert rule.compare_row(0, ref, other).allowed
    # Beyond either bound it still fails; explicit bounds win over the variable.
    assert not rule.compare_row(0, *_rows(margin=1.6, distance=5.0)).allowed
    assert not rule.compare_row(0, *_rows(margin=1.0, distance=9.5)).allowed
    assert NearTieRule(margin_bound=0.5) == NearTieRule(0.5, 9.0)


@pytest.mark.parametrize("value", ["2", "1,2,3", "a,b", "0,3", "1,-1", "nan,3"])
def test_a_malformed_value_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(BOUNDS_ENV, value)
    with pytest.raises(ValueError, match=f"{BOUNDS_ENV}=.*two positive numbers MARGIN,DISTANCE"):
        NearTieRule()
