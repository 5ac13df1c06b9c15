"""llama.cpp's DRY sampler (ruvllm.dry) against a direct reading of its rule, and its sequence
breakers on a real vocabulary."""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm import dry
from ruvllm.sampling import Sampler
from ruvllm.types import GenerationParams


def _reference(history: list[int], vocab: int, multiplier: float, base: float, allowed: int) -> np.ndarray:
    """For each earlier position j, the length of the longest run ending at j that equals the
    history's end; the token after j then loses multiplier * base ** (length - allowed)."""
    n = len(history)
    longest: dict[int, int] = {}
    for j in range(n - 1):
        m = 0
        while m <= j and history[j - m] == history[n - 1 - m]:
            m += 1
        if m >= allowed:
            longest[history[j + 1]] = max(longest.get(history[j + 1], 0), m)
    out = np.zeros(vocab, dtype=np.float32)
    for token, m in longest.items():
        out[token] -= multiplier * base ** (m - allowed)
    return out


@pytest.mark.parametrize("seed", range(8))
def test_penalties_match_the_rule_without_breakers(seed):
    rng = np.random.default_rng(seed)
    history = list(rng.integers(0, 4, size=60))  # a small alphabet: plenty of repeats
    scores = np.zeros(6, dtype=np.float32)
    got = dry.penalised(scores, history, {}, multiplier=0.8, base=1.75, allowed_length=2, last_n=-1)
    np.testing.assert_allclose(got, _reference(history, 6, 0.8, 1.75, 2), rtol=1e-5)
    window = dry.penalised(scores, history, {}, multiplier=0.8, base=1.75, allowed_length=2, last_n=20)
    np.testing.assert_allclose(window, _reference(history[-20:], 6, 0.8, 1.75, 2), rtol=1e-5)


def test_a_breaker_ends_what_a_repetition_may_span():
    a, b, c, nl = 1, 2, 3, 9
    history = [a, b, c, nl, a, b]  # "a b" repeats; "c" would extend it
    scores = np.zeros(10, dtype=np.float32)
    free = dry.penalised(scores, history, {}, multiplier=1.0, base=2.0, allowed_length=2, last_n=-1)
    assert free[c] == pytest.approx(-1.0) and free.sum() == pytest.approx(-1.0)
    # A breaker inside the span: the repetition reaches back only to it.
    broken = dry.penalised(scores, [a, b, c, nl, a, nl, b], {nl: ((),)}, multiplier=1.0, base=2.0,
                           allowed_length=2, last_n=-1)
    assert not broken.any()
    # A token that is a breaker alone is never penalised.
    assert not dry.penalised(scores, [a, nl, b, a, nl], {nl: ((),)}, multiplier=1.0, base=2.0,
                             allowed_length=1, last_n=-1)[nl]


class _Words:
    """A tokenizer over a fixed vocabulary of words (for restart sequences)."""

    def __init__(self, words: list[str]):
        self.words = words
        self.vocab_size = len(words)

    def token_text(self, token: int) -> str:
        return self.words[token]

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [self.words.index(text)]


def test_restart_sequences_are_llama_cpps():
    words = ["hi", "a\\n", "\\n", "x*", "ab", "c"]
    seqs = dry.restart_sequences(_Words(words), ("\\n", "*", "abc"))
    assert () in seqs[1] and () in seqs[2] and () in seqs[3]  # a breaker inside the token
    assert seqs[4] == ((5,),)  # "ab" starts "abc": a breaker when "c" follows
    assert 0 not in seqs


def test_the_sampler_runs_dry_with_the_models_tokenizer_only():
    logits = np.zeros(10, dtype=np.float32)
    logits[3] = 0.5
    params = GenerationParams(dry_multiplier=1.0, dry_base=2.0, dry_allowed_length=2)
    with pytest.raises(Exception) as refused:
        Sampler(params, 10, [1, 2, 3, 9, 1, 2])
    assert refused.value.field == "dry_multiplier"
    sampler = Sampler(params, 10, [1, 2, 3, 9, 1, 2], dry_breakers=dict)
    assert sampler.sample(logits).token_id != 3  # 0.5 - 1.0 < 0: "3" would extend "1 2"
