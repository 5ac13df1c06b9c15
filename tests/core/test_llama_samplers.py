"""llama.cpp's other samplers (ruvllm.llama_samplers) against llama.cpp's rules, case by case, and
through core's Sampler in llama.cpp's order."""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm import llama_samplers
from ruvllm.errors import InvalidRequest
from ruvllm.sampling import Sampler
from ruvllm.types import GenerationParams


def test_top_n_sigma_keeps_logits_within_n_deviations_of_the_best():
    scores = np.array([10.0, 9.0, 5.0, 0.0, 0.0, -np.inf], dtype=np.float32)
    finite = scores[:5]
    cut = llama_samplers.top_n_sigma(scores, 1.0)
    kept = np.flatnonzero(np.isfinite(cut))
    assert list(kept) == [i for i in range(5) if scores[i] >= finite.max() - finite.std()]
    assert list(kept) == [0, 1]
    np.testing.assert_array_equal(llama_samplers.top_n_sigma(scores, 0.0), scores)  # off


def _typical_reference(probs: np.ndarray, p: float) -> set[int]:
    """llama_sampler_typical_apply, loop for loop (min_keep 0)."""
    q = probs / probs.sum()
    entropy = -sum(x * np.log(x) for x in q)
    shifted = [abs(-np.log(x) - entropy) for x in q]
    order = sorted(range(len(q)), key=lambda i: shifted[i])
    total = 0.0
    for rank, i in enumerate(order):
        total += q[i]
        if total > p:
            return set(order[:rank + 1])
    return set(order)


@pytest.mark.parametrize("p", [0.2, 0.5, 0.9, 0.99])
def test_typical_keeps_what_llama_cpp_keeps(p):
    rng = np.random.default_rng(0)
    for _ in range(20):
        probs = rng.dirichlet(np.full(12, 0.5))
        assert set(llama_samplers.typical(probs, p).tolist()) == _typical_reference(probs, p)


def test_xtc_drops_the_top_choices_but_the_last_above_the_threshold():
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    kept = np.arange(4)
    assert sorted(llama_samplers.xtc(kept, probs, 0.1, chance=0.0, probability=1.0)) == [0, 2]
    # Unchanged: the draw missed, one token alone is above the threshold, a threshold above 0.5.
    for threshold, chance, probability in ((0.1, 0.6, 0.5), (0.45, 0.0, 1.0), (0.6, 0.0, 1.0)):
        assert list(llama_samplers.xtc(kept, probs, threshold, chance, probability)) == [0, 1, 2, 3]


def test_the_dynamic_temperature_follows_the_entropy():
    flat, peaked = np.ones(8), np.array([1.0] + [1e-6] * 7)
    assert llama_samplers.dynamic_temperature(flat, 1.0, 0.5, 1.0) == pytest.approx(1.5)
    assert llama_samplers.dynamic_temperature(peaked, 1.0, 0.5, 1.0) == pytest.approx(0.5, abs=1e-3)
    assert llama_samplers.dynamic_temperature(flat, 1.0, 0.0, 1.0) == 1.0


def test_the_sampler_runs_them_in_llama_cpps_order_only():
    logits = np.log(np.array([0.6, 0.25, 0.1, 0.05], dtype=np.float32))
    with pytest.raises(InvalidRequest) as refused:
        Sampler(GenerationParams(temperature=1.0, typical_p=0.5), 4)
    assert refused.value.field == "typical_p"
    xtc = Sampler(GenerationParams(temperature=1.0, temperature_last=True, xtc_probability=1.0,
                                   xtc_threshold=0.2, seed=1), 4)
    assert {xtc.sample(logits).token_id for _ in range(60)} == {1, 2, 3}  # 0.6 dropped, 0.25 the last above
    typical = Sampler(GenerationParams(temperature=1.0, temperature_last=True, typical_p=0.2, seed=1), 4)
    kept = set(llama_samplers.typical(np.exp(logits), 0.2).tolist())
    assert {typical.sample(logits).token_id for _ in range(60)} == kept


def _mirostat_v2_reference(logits: np.ndarray, temperature: float, tau: float, eta: float,
                           uniforms: list[float]) -> tuple[list[int], float]:
    """llama_sampler_mirostat_v2_apply, step for step, with the draws given."""
    mu, tokens = 2 * tau, []
    for u in uniforms:
        scaled = logits / temperature
        order = sorted(range(len(scaled)), key=lambda i: -scaled[i])
        p = np.exp(scaled[order] - scaled[order[0]])
        p /= p.sum()
        size = next((i for i, x in enumerate(p) if -np.log2(x) > mu), len(p)) or 1
        kept = p[:size] / p[:size].sum()
        total, idx = 0.0, size - 1
        for i, x in enumerate(kept):
            total += x
            if u < total:
                idx = i
                break
        tokens.append(order[idx])
        mu -= eta * (-np.log2(kept[idx]) - tau)
    return tokens, mu


def test_mirostat_2_follows_llama_cpp_step_for_step():
    logits = np.log(np.array([0.4, 0.25, 0.15, 0.1, 0.06, 0.04]))
    uniforms = list(np.random.default_rng(3).random(40))
    expected, mu = _mirostat_v2_reference(logits, 0.8, 1.5, 0.2, uniforms)
    state = llama_samplers.Mirostat(2, tau=1.5, eta=0.2, vocab_size=6)
    got = [state.choose(logits.astype(np.float32), 0.8, u) for u in uniforms]
    assert got == expected and state.mu == pytest.approx(mu, abs=1e-5)
    assert len(set(got)) > 1  # the bound moved: more than the favourite was drawn


def test_mirostat_1_keeps_the_top_k_its_estimate_implies():
    zipf = np.log(1.0 / np.arange(1, 201) ** 1.2)  # a Zipf distribution, exponent 1.2
    state = llama_samplers.Mirostat(1, tau=3.0, eta=0.1, vocab_size=200)
    assert 1 < state._kept(np.exp(zipf) / np.exp(zipf).sum()) < 200
    low = llama_samplers.Mirostat(1, tau=0.01, eta=0.1, vocab_size=200)
    assert low._kept(np.exp(zipf) / np.exp(zipf).sum()) == 1  # a tiny surprise bound: the best alone
    sampler = Sampler(GenerationParams(temperature=1.0, mirostat=2, mirostat_tau=0.1, seed=0), 200)
    assert {sampler.sample(zipf.astype(np.float32)).token_id for _ in range(20)} == {0}
