"""The shared sampler: greedy, seeds, top-k/top-p/min-p, temperature, penalties and logprobs.

Distribution checks draw a few thousand samples with a fixed seed from a small crafted logits
vector and compare the empirical frequencies with the exact target distribution through a
chi-square statistic; with a fixed seed the outcome is deterministic, and the thresholds are
the 0.1 % critical values, so a correct sampler passes with a wide margin while a sampler that
ignores the filter (or the temperature) fails by orders of magnitude.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.sampling import Sampler, _draw_index, _nucleus, log_softmax, top_logprobs
from ruvllm.types import GenerationParams

#: chi-square critical values at p = 0.001 by degrees of freedom.
CHI2_CRIT = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 9: 27.88}

PROBS = np.array([0.5, 0.3, 0.15, 0.05])
LOGITS = np.log(PROBS).astype(np.float32)


def draws(params: GenerationParams, logits: np.ndarray, n: int) -> np.ndarray:
    sampler = Sampler(params, len(logits))
    return np.array([sampler.sample(logits).token_id for _ in range(n)])


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def chi_square(samples: np.ndarray, expected_probs: np.ndarray) -> float:
    """Statistic over the tokens with non-zero expected probability."""
    support = np.flatnonzero(expected_probs > 0)
    counts = np.bincount(samples, minlength=len(expected_probs))[support]
    expected = expected_probs[support] * len(samples)
    return float(((counts - expected) ** 2 / expected).sum())


def entropy(samples: np.ndarray, vocab: int) -> float:
    p = np.bincount(samples, minlength=vocab) / len(samples)
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


# -- greedy and seeds ---------------------------------------------------------------------------
def test_greedy_is_argmax():
    rng = np.random.default_rng(0)
    for _ in range(50):
        logits = rng.normal(size=300).astype(np.float32)
        assert Sampler(GenerationParams(), 300).sample(logits).token_id == int(np.argmax(logits))


def test_greedy_accepts_other_float_dtypes():
    logits = np.array([0.1, 3.0, -1.0], dtype=np.float16)
    assert Sampler(GenerationParams(), 3).sample(logits).token_id == 1


def test_same_seed_same_tokens():
    logits = np.zeros(1000, dtype=np.float32)
    p = GenerationParams(temperature=1.0, seed=1234)
    assert list(draws(p, logits, 64)) == list(draws(p, logits, 64))


def test_different_seeds_differ():
    logits = np.zeros(1000, dtype=np.float32)
    a = draws(GenerationParams(temperature=1.0, seed=1), logits, 64)
    b = draws(GenerationParams(temperature=1.0, seed=2), logits, 64)
    assert list(a) != list(b)


def test_top_k_1_is_greedy_even_when_hot():
    rng = np.random.default_rng(1)
    for seed in range(30):
        logits = rng.normal(size=500).astype(np.float32)
        s = Sampler(GenerationParams(temperature=2.0, top_k=1, seed=seed), 500)
        assert s.sample(logits).token_id == int(np.argmax(logits))


# -- filters ------------------------------------------------------------------------------------
def test_top_k_restricts_support_and_keeps_proportions():
    logits = np.array([0.0, 2.0, -1.0, 1.5, 1.0, -3.0, 0.5, 1.2], dtype=np.float32)
    samples = draws(GenerationParams(temperature=1.0, top_k=3, seed=3), logits, 4000)
    top3 = set(np.argsort(-logits)[:3].tolist())  # {1, 3, 7}
    assert set(samples.tolist()) == top3
    target = np.where(np.isin(np.arange(8), list(top3)), softmax(logits), 0.0)
    target /= target.sum()
    assert chi_square(samples, target) < CHI2_CRIT[2]


@pytest.mark.parametrize(
    ("top_p", "nucleus"),
    [(0.4, {0}), (0.75, {0, 1}), (0.85, {0, 1, 2}), (0.99, {0, 1, 2, 3})],
)
def test_top_p_keeps_the_smallest_nucleus(top_p, nucleus):
    samples = draws(GenerationParams(temperature=1.0, top_p=top_p, seed=5), LOGITS, 3000)
    assert set(samples.tolist()) == nucleus
    target = np.where(np.isin(np.arange(4), list(nucleus)), PROBS, 0.0)
    target /= target.sum()
    if len(nucleus) > 1:
        assert chi_square(samples, target) < CHI2_CRIT[len(nucleus) - 1]


def test_top_p_nucleus_wider_than_the_probe_on_a_50k_vocab():
    vocab = 50_000
    # Strictly decreasing, nearly flat: the nucleus for 0.9 holds ~45k tokens, far more than the
    # 1024 candidates the fast path looks at first.
    logits = (-1e-5 * np.arange(vocab)).astype(np.float32)
    probs = softmax(logits.astype(np.float64))
    k = int(np.searchsorted(np.cumsum(probs), 0.9) + 1)
    assert k > 40_000
    kept, cdf = _nucleus(softmax(logits).astype(np.float32), 0.9)
    assert abs(len(kept) - k) <= 1
    assert sorted(kept.tolist()) == list(range(len(kept)))  # the most probable tokens, in order
    assert cdf[-1] >= 0.9 and cdf[-2] < 0.9  # smallest set: one token fewer misses the mass

    samples = draws(GenerationParams(temperature=1.0, top_p=0.9, seed=11), logits, 300)
    assert samples.max() <= k
    assert samples.max() > 0.95 * k  # the whole nucleus is reachable, not just the probe
    assert np.count_nonzero(samples >= 1024) > 250


def reference_nucleus(probs: np.ndarray, top_p: float) -> set[int]:
    order = np.argsort(-probs.astype(np.float64), kind="stable")
    cum = np.cumsum(probs[order].astype(np.float64)) / probs.astype(np.float64).sum()
    return set(order[: int(np.searchsorted(cum, top_p)) + 1].tolist())


def weights_big_plus_tail(n_tail: int) -> np.ndarray:
    """One token of weight 1, then a tail of distinct weights below the 1/1000 threshold."""
    rng = np.random.default_rng(n_tail)
    w = np.concatenate([[1.0], 4e-4 * (1 - np.linspace(0, 0.5, n_tail))]).astype(np.float32)
    return w[rng.permutation(len(w))]


def peaked_weights() -> np.ndarray:
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 1, 20_000)
    logits[rng.choice(20_000, 10, replace=False)] += rng.uniform(12, 16, 10)
    return np.exp(logits - logits.max()).astype(np.float32)


@pytest.mark.parametrize(
    ("name", "weights", "top_p"),
    [
        ("peaked: near-best threshold", peaked_weights(), 0.9),
        ("tail: top-1024 probe", weights_big_plus_tail(2000), 0.7),  # ~310 tokens
        ("tail: top-8192 probe", weights_big_plus_tail(20_000), 0.4),  # ~4700 tokens
        ("flat: full sort", np.linspace(1.0, 1.5, 30_000, dtype=np.float32)[::-1].copy(), 0.5),
    ],
)
def test_every_nucleus_path_agrees_with_a_full_sort(name, weights, top_p):
    kept, cdf = _nucleus(weights, top_p)
    assert set(kept.tolist()) == reference_nucleus(weights, top_p), name
    assert np.all(np.diff(weights[kept]) <= 0)  # most probable first
    assert cdf[-1] >= top_p and (len(cdf) == 1 or cdf[-2] < top_p)


def test_top_p_on_flat_50k_logits_keeps_ninety_percent_of_tokens():
    kept, cdf = _nucleus(np.full(50_000, 1 / 50_000, dtype=np.float32), 0.9)
    assert abs(len(kept) - 45_000) <= 1 and len(set(kept.tolist())) == len(kept)
    assert cdf[-1] == pytest.approx(0.9, abs=1e-4)
    samples = draws(GenerationParams(temperature=1.0, top_p=0.9, seed=2), np.zeros(50_000, np.float32), 300)
    assert len(set(samples.tolist())) > 280  # nearly every draw is a different token


@pytest.mark.parametrize(("min_p", "support"), [(0.2, {0, 1, 2}), (0.5, {0, 1}), (0.9, {0})])
def test_min_p_drops_tokens_below_a_fraction_of_the_best(min_p, support):
    samples = draws(GenerationParams(temperature=1.0, min_p=min_p, seed=8), LOGITS, 3000)
    assert set(samples.tolist()) == support
    target = np.where(np.isin(np.arange(4), list(support)), PROBS, 0.0)
    target /= target.sum()
    if len(support) > 1:
        assert chi_square(samples, target) < CHI2_CRIT[len(support) - 1]


def test_filters_compose():
    logits = np.array([3.0, 2.9, 2.8, 0.0, -1.0, 2.7], dtype=np.float32)
    # top_k keeps {0, 1, 2, 5}; top_p then keeps the smallest prefix of those reaching 0.5.
    samples = draws(GenerationParams(temperature=1.0, top_k=4, top_p=0.5, seed=4), logits, 2000)
    assert set(samples.tolist()) == {0, 1}


def test_two_level_draw_matches_the_flat_inverse_cdf():
    rng = np.random.default_rng(5)
    probs = rng.random(50_000).astype(np.float32) ** 4
    probs[rng.random(50_000) < 0.3] = 0.0  # masked tokens must never be drawn
    cdf = np.cumsum(probs, dtype=np.float64)
    for u in rng.random(2000):
        assert _draw_index(probs, u) == int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    for u in (0.0, 1e-12, float(np.nextafter(1.0, 0.0))):
        assert probs[_draw_index(probs, u)] > 0


def test_extreme_uniforms_never_pick_a_masked_token():
    probs = np.zeros(20_000, dtype=np.float32)
    probs[[3, 7000, 12_345]] = [0.2, 0.5, 0.3]
    top = float(np.nextafter(1.0, 0.0))
    assert [_draw_index(probs, u) for u in (0.0, 0.1999, 0.2001, 0.69, 0.71, top)] == [
        3, 3, 7000, 7000, 12_345, 12_345
    ]


def test_full_vocab_sampling_on_a_large_row_follows_the_softmax():
    vocab = 8192  # long enough for the two-level draw
    logits = np.random.default_rng(6).normal(0.0, 2.0, size=vocab).astype(np.float32)
    samples = draws(GenerationParams(temperature=1.0, seed=6), logits, 5000)
    probs = softmax(logits.astype(np.float64))
    # Ten bins of tokens holding roughly equal probability mass each.
    order = np.argsort(-probs)
    edges = np.searchsorted(np.cumsum(probs[order]), np.linspace(0.1, 0.9, 9))
    bin_of = np.empty(vocab, dtype=np.int64)
    bin_of[order] = np.searchsorted(edges, np.arange(vocab), side="right")
    bin_probs = np.bincount(bin_of, weights=probs, minlength=10)
    assert chi_square(bin_of[samples], bin_probs) < CHI2_CRIT[9]


# -- temperature --------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [0.5, 1.0, 1.7])
def test_temperature_scales_the_distribution(temperature):
    logits = np.array([2.0, 1.0, 0.0, -1.0, 0.5], dtype=np.float32)
    samples = draws(GenerationParams(temperature=temperature, seed=21), logits, 5000)
    target = softmax(logits / temperature)
    assert chi_square(samples, target) < CHI2_CRIT[4]
    # The untempered distribution is rejected when the temperature is far from 1.
    if temperature != 1.0:
        assert chi_square(samples, softmax(logits)) > 3 * CHI2_CRIT[4]


def test_higher_temperature_means_higher_entropy():
    logits = np.array([2.0, 1.0, 0.0, -1.0, 0.5], dtype=np.float32)
    h = [entropy(draws(GenerationParams(temperature=t, seed=9), logits, 4000), 5) for t in (0.3, 1.0, 2.0)]
    assert h[0] < h[1] < h[2]


# -- penalties ----------------------------------------------------------------------------------
def test_repetition_penalty_applies_to_prompt_tokens():
    logits = np.array([2.0, 1.9, 0.5], dtype=np.float32)
    assert Sampler(GenerationParams(), 3, prompt_ids=[0]).sample(logits).token_id == 0
    penalised = Sampler(GenerationParams(repetition_penalty=1.2), 3, prompt_ids=[0])
    assert penalised.sample(logits).token_id == 1  # 2.0 / 1.2 < 1.9


def test_repetition_penalty_multiplies_negative_logits():
    logits = np.array([-1.0, -1.1, -5.0], dtype=np.float32)
    s = Sampler(GenerationParams(repetition_penalty=1.2), 3, prompt_ids=[0])
    assert s.sample(logits).token_id == 1  # -1.0 * 1.2 = -1.2 < -1.1


def test_repetition_penalty_applies_to_generated_tokens():
    logits = np.array([2.0, 1.9, 0.5], dtype=np.float32)
    s = Sampler(GenerationParams(repetition_penalty=1.2), 3)
    assert [s.sample(logits).token_id for _ in range(3)] == [0, 1, 0]  # 2.0/1.2 > 1.9/1.2


def test_frequency_penalty_grows_with_count():
    logits = np.array([1.0, 0.5, 0.0], dtype=np.float32)
    s = Sampler(GenerationParams(frequency_penalty=0.3), 3)
    # 1.0, then 1.0 - 0.3 = 0.7 > 0.5, then 1.0 - 0.6 = 0.4 < 0.5
    assert [s.sample(logits).token_id for _ in range(3)] == [0, 0, 1]


def test_presence_penalty_is_flat():
    logits = np.array([1.0, 0.5, 0.0], dtype=np.float32)
    s = Sampler(GenerationParams(presence_penalty=0.3), 3)
    assert [s.sample(logits).token_id for _ in range(4)] == [0, 0, 0, 0]
    s = Sampler(GenerationParams(presence_penalty=0.6), 3)
    assert [s.sample(logits).token_id for _ in range(3)] == [0, 1, 0]  # 0.4 < 0.5, then 0.4 > -0.1


def test_negative_presence_penalty_encourages_repeats():
    logits = np.array([1.0, 1.1, 0.0], dtype=np.float32)
    s = Sampler(GenerationParams(presence_penalty=-0.5), 3)
    first = s.sample(logits).token_id
    assert first == 1
    assert [s.sample(logits).token_id for _ in range(3)] == [1, 1, 1]


def test_frequency_and_presence_ignore_the_prompt():
    logits = np.array([1.0, 0.5, 0.0], dtype=np.float32)
    s = Sampler(GenerationParams(frequency_penalty=2.0, presence_penalty=2.0), 3, prompt_ids=[0, 0, 0])
    assert s.sample(logits).token_id == 0


def test_penalties_tolerate_logits_wider_than_the_vocab():
    # Engines often pad the logits row beyond the tokenizer's vocabulary.
    logits = np.array([2.0, 1.9, 0.5, -9.0, -9.0], dtype=np.float32)
    s = Sampler(GenerationParams(repetition_penalty=1.5), vocab_size=3, prompt_ids=[0, 7])
    assert s.sample(logits).token_id == 1


# llama.cpp's penalty window (penalty_last_n): its penalties sampler, reproduced rule by rule.
def test_a_window_penalises_only_its_last_tokens_prompt_included():
    logits = np.array([2.0, 1.9, 0.5], dtype=np.float32)
    # Token 0 is the prompt's third-last token: inside a window of 3, outside one of 2.
    inside = Sampler(GenerationParams(repetition_penalty=1.2, penalty_last_n=3), 3, prompt_ids=[0, 2, 2])
    outside = Sampler(GenerationParams(repetition_penalty=1.2, penalty_last_n=2), 3, prompt_ids=[0, 2, 2])
    assert inside.sample(logits).token_id == 1 and outside.sample(logits).token_id == 0
    # The window slides: token 0, chosen, pushes itself in and the prompt's tokens out.
    slid = Sampler(GenerationParams(repetition_penalty=1.2, penalty_last_n=1), 3, prompt_ids=[1])
    assert [slid.sample(logits).token_id for _ in range(4)] == [0, 1, 0, 1]


def test_in_a_window_frequency_and_presence_count_the_prompt_too():
    logits = np.array([1.0, 0.5, 0.0], dtype=np.float32)
    # llama.cpp: 1.0 - 3 * 0.2 - 0.1 = 0.3 < 0.5 (OpenAI's rule ignores the prompt: token 0).
    windowed = Sampler(GenerationParams(frequency_penalty=0.2, presence_penalty=0.1, penalty_last_n=64), 3,
                       prompt_ids=[0, 0, 0])
    assert windowed.sample(logits).token_id == 1
    whole = Sampler(GenerationParams(frequency_penalty=0.2, presence_penalty=0.1, penalty_last_n=-1), 3,
                    prompt_ids=[0, 0, 0] + [2] * 500)
    assert whole.sample(logits).token_id == 1  # -1: every token, however far back


def test_a_window_of_zero_turns_the_penalties_off():
    logits = np.array([2.0, 1.9, 0.5], dtype=np.float32)
    s = Sampler(GenerationParams(repetition_penalty=1.9, frequency_penalty=1.0, penalty_last_n=0), 3,
                prompt_ids=[0, 0])
    assert [s.sample(logits).token_id for _ in range(3)] == [0, 0, 0]


def test_a_window_multiplies_non_positive_logits_as_llama_cpp_does():
    logits = np.array([0.0, -0.1, -5.0], dtype=np.float32)
    # llama.cpp: logit <= 0 is multiplied, so 0 stays 0 and -0.1 becomes -0.12; token 0 still wins.
    s = Sampler(GenerationParams(repetition_penalty=1.2, penalty_last_n=4), 3, prompt_ids=[0, 1])
    assert s.sample(logits).token_id == 0
    with pytest.raises(InvalidRequest):
        GenerationParams(penalty_last_n=-2)


# vLLM's allowed_token_ids and bad_words (banned_sequences).
def test_allowed_token_ids_keep_every_other_token_out():
    logits = np.array([3.0, 2.0, 1.0, 0.5], dtype=np.float32)
    s = Sampler(GenerationParams(allowed_token_ids=(2, 3), temperature=1.0, seed=0), 4)
    assert {s.sample(logits).token_id for _ in range(50)} == {2, 3}


def test_a_banned_sequence_bans_its_last_token_only_after_the_rest():
    logits = np.array([3.0, 2.0, 1.0], dtype=np.float32)
    alone = Sampler(GenerationParams(banned_sequences=((0,),)), 3)
    assert alone.sample(logits).token_id == 1  # a one-token sequence: never
    pair = Sampler(GenerationParams(banned_sequences=((0, 0),)), 3)
    # 0 is free at first, then banned right after a 0, then free again after the 1.
    assert [pair.sample(logits).token_id for _ in range(4)] == [0, 1, 0, 1]


def test_allowed_tokens_a_grammar_excludes_leave_the_grammar_its_choice():
    logits = np.array([3.0, 2.0, 1.0], dtype=np.float32)

    def only_two(_, scores):
        return np.where(np.arange(3) == 2, scores, -np.inf)

    s = Sampler(GenerationParams(allowed_token_ids=(0,)), 3, logits_processors=[only_two])
    assert s.sample(logits).token_id == 2


# -- logprobs -----------------------------------------------------------------------------------
def test_chosen_logprob_is_log_softmax_of_the_raw_logits():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=200).astype(np.float32)
    ref = np.log(softmax(logits.astype(np.float64)))
    params = GenerationParams(temperature=0.7, top_k=20, repetition_penalty=1.3, logprobs=5, seed=1)
    s = Sampler(params, 200, prompt_ids=[int(np.argmax(logits))])
    for _ in range(10):
        tok = s.sample(logits)
        assert tok.logprob == pytest.approx(ref[tok.token_id], abs=1e-5)
        assert len(tok.top_logprobs) == 5
        ids = [i for i, _ in tok.top_logprobs]
        lps = [lp for _, lp in tok.top_logprobs]
        assert lps == sorted(lps, reverse=True)
        assert ids == list(np.argsort(-ref)[:5])
        assert lps == pytest.approx(list(ref[ids]), abs=1e-5)


def test_logprobs_zero_gives_only_the_chosen_token():
    tok = Sampler(GenerationParams(logprobs=0), 4).sample(LOGITS)
    assert tok.token_id == 0
    assert tok.logprob == pytest.approx(np.log(0.5), abs=1e-6)
    assert tok.top_logprobs == ()


def test_no_logprobs_when_not_requested():
    tok = Sampler(GenerationParams(), 4).sample(LOGITS)
    assert tok.logprob is None and tok.top_logprobs == ()


def test_logprobs_wider_than_a_tiny_vocab_report_every_token():
    tok = Sampler(GenerationParams(logprobs=5), 3).sample(np.array([0.0, 1.0, 2.0], np.float32))
    assert [i for i, _ in tok.top_logprobs] == [2, 1, 0]


def test_tied_logprobs_list_the_greedy_token_first():
    # The failure seen on bf16 candle_like: two tokens share the best logit exactly; greedy takes
    # the lower id (argmax), so top_logprobs[0] must be that token, not its twin.
    logits = np.zeros(64, np.float32)
    logits[[33, 34, 9, 40]] = [5.0, 5.0, 4.0, 4.0]
    tok = Sampler(GenerationParams(logprobs=3), 64).sample(logits)
    assert tok.token_id == 33
    assert [i for i, _ in tok.top_logprobs] == [33, 34, 9]


def test_a_tie_at_the_last_place_keeps_the_lowest_ids():
    logits = np.zeros(4096, np.float32)
    logits[4000] = 3.0
    logits[[3000, 7, 2500, 100]] = 2.0  # four tokens tie for the last two places
    ids = [i for i, _ in top_logprobs(log_softmax(logits), 3)]
    assert ids == [4000, 7, 100]


def test_log_softmax_is_stable_for_large_logits():
    lp = log_softmax(np.array([1000.0, 1000.0], dtype=np.float32))
    assert np.allclose(lp, np.log(0.5))


def test_one_nucleus_sample_on_a_real_vocab_size_runs():
    """A smoke run at SmolLM2's vocabulary size; speed is measured in benchmarks/sampler_bench.py."""
    logits = np.random.default_rng(0).normal(size=49_152).astype(np.float32) * 3
    s = Sampler(GenerationParams(temperature=0.8, top_p=0.9, seed=0, logprobs=5), 49_152)
    t0 = time.perf_counter()
    tok = s.sample(logits)
    elapsed_us = (time.perf_counter() - t0) * 1e6
    print(f"one top_p=0.9 sample on a 49152 vocab: {elapsed_us:.0f} us")
    assert 0 <= tok.token_id < 49_152


def test_min_tokens_keeps_the_end_ids_out_until_reached():
    """EOS and stop ids are not sampled before ``min_tokens``, even when they are the argmax."""
    logits = np.array([5.0, 1.0, 0.0, 4.0], dtype=np.float32)  # 0: EOS, 3: a stop id
    sampler = Sampler(GenerationParams(temperature=0, min_tokens=2), 4, end_ids={0, 3})
    assert [sampler.sample(logits).token_id for _ in range(3)] == [1, 1, 0]


def test_min_tokens_lets_a_complete_grammar_end_the_answer():
    """A grammar that allows nothing but the end wins over min_tokens: no token is invented."""
    only_end = np.array([0.0, -np.inf, -np.inf], dtype=np.float32)
    sampler = Sampler(GenerationParams(temperature=0, min_tokens=5), 3, end_ids={0})
    assert sampler.sample(only_end).token_id == 0


def test_min_tokens_without_the_end_ids_is_refused():
    with pytest.raises(InvalidRequest) as err:
        Sampler(GenerationParams(min_tokens=1), 4)
    assert err.value.field == "min_tokens"
    with pytest.raises(InvalidRequest, match="at most max_tokens"):
        GenerationParams(max_tokens=4, min_tokens=5)


def test_min_tokens_is_refused_where_the_backend_samples_by_itself():
    from ruvllm.engine.prompt_logprobs import check_logits_options

    with pytest.raises(InvalidRequest, match="samples inside its own engine") as err:
        check_logits_options(GenerationParams(min_tokens=1), path="request", backend="mistralrs",
                             vocab_size=4, executor=None)
    assert err.value.field == "min_tokens"


# -- llama.cpp's order: the filters on the model's own probabilities, the temperature last --------

def test_temperature_last_filters_with_top_p_before_the_temperature_flattens():
    logits = np.log(np.array([0.6, 0.25, 0.15])).astype(np.float32)
    # At temperature 1 the best token alone reaches top_p 0.5; at temperature 2 it does not.
    last = draws(GenerationParams(temperature=2.0, top_p=0.5, temperature_last=True, seed=3), logits, 500)
    first = draws(GenerationParams(temperature=2.0, top_p=0.5, seed=3), logits, 500)
    assert set(last.tolist()) == {0}
    assert set(first.tolist()) == {0, 1}


def test_temperature_last_reshapes_what_min_p_kept():
    probs = np.array([0.5, 0.2, 0.3])
    logits = np.log(probs).astype(np.float32)
    # min_p 0.5 at temperature 1 keeps the tokens at half the best or more: 0 and 2; the
    # temperature (2) then flattens those two only: weights p ** (1 / 2).
    samples = draws(GenerationParams(temperature=2.0, min_p=0.5, temperature_last=True, seed=9), logits, 4000)
    target = np.array([0.5, 0.0, 0.3]) ** (1 / 2)
    assert chi_square(samples, target / target.sum()) < CHI2_CRIT[1]
    # Temperature first, (0.2 / 0.5) ** (1/2) = 0.63 passes min_p: token 1 is drawn too.
    first = draws(GenerationParams(temperature=2.0, min_p=0.5, seed=9), logits, 4000)
    assert 1 in first.tolist()


def test_temperature_last_keeps_top_k_and_greedy_as_they_are():
    logits = np.array([3.0, 2.9, 2.8, 0.0, -1.0, 2.7], dtype=np.float32)
    samples = draws(GenerationParams(temperature=2.0, top_k=2, temperature_last=True, seed=4), logits, 2000)
    target = np.exp(np.array([3.0, 2.9, 0, 0, 0, 0]) / 2.0) * np.array([1, 1, 0, 0, 0, 0])
    assert chi_square(samples, target / target.sum()) < CHI2_CRIT[1]
    assert draws(GenerationParams(temperature=0.0, temperature_last=True), logits, 3).tolist() == [0, 0, 0]
