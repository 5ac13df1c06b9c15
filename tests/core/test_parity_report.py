"""The parity criterion itself must be able to fail: a model that disagrees with llama.cpp
where llama.cpp was sure, or too often, is reported."""

from __future__ import annotations

import numpy as np
from ruvllm.testing.parity import teacher_forced

VOCAB = 8


class FakeReference:
    """llama.cpp stand-in: greedy continuation 1, 2, 3, ... with fixed logits margins."""

    def __init__(self, margin: float):
        self.margin = margin

    def greedy(self, ids, n):
        return [(ids[-1] + 1 + i) % VOCAB for i in range(n)]

    def logits(self, sequence, first_row):
        rows = np.zeros((len(sequence) - first_row, VOCAB))
        for r, token in enumerate(sequence[first_row:]):
            rows[r, (token + 1) % VOCAB] = self.margin
        return rows


def copying(sequence, first):
    """A model that predicts exactly what the reference does."""
    return FakeReference(1.0).logits(sequence, first)


def off_by_one_at(position):
    def logits(sequence, first):
        rows = copying(sequence, first)
        rows[position] = np.roll(rows[position], 1)
        return rows
    return logits


def test_agreeing_model_passes():
    report = teacher_forced(FakeReference(5.0), [[0], [3]], copying, 4)
    assert (report.agree, report.total, report.identical_prefix) == (8, 8, (4, 4))
    assert report.problems(expected_total=8, near_tie=0.5, min_rate=0.9) == []


def test_confident_disagreement_fails_even_when_rare():
    report = teacher_forced(FakeReference(5.0), [[0]] * 10, off_by_one_at(2), 4)
    assert report.identical_prefix == (2,) * 10
    assert report.disagreements[0].margin == 5.0
    assert any("not near a tie" in p for p in report.problems(expected_total=40, near_tie=0.5, min_rate=0.5))


def test_near_ties_pass_but_frequent_misses_fail():
    report = teacher_forced(FakeReference(0.2), [[0]], off_by_one_at(1), 4)
    assert report.beyond(0.5) == []
    assert report.problems(expected_total=4, near_tie=0.5, min_rate=0.5) == []
    assert any("below 90%" in p for p in report.problems(expected_total=4, near_tie=0.5, min_rate=0.9))
