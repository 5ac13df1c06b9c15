"""Greedy output and first-step logits against llama.cpp on the embedded model.

Tolerance, and why: the embedded model's weights are Q4_1/Q8_0. We dequantise them exactly,
but llama.cpp also quantises the *activations* (to Q8_1/Q8_0) inside every matmul and keeps KV
in F16, which moves logits by up to ~1.5 (measured; see LOGIT_BOUND). So greedy output is
compared teacher-forced (ruvllm.testing.parity): at >= 90 % of 8 x 32 positions the top-1 must
equal llama.cpp's, and wherever it differs llama.cpp's own margin between the two tokens must be
under NEAR_TIE (a near-tie that rounding breaks either way). With F32 weights (no activation
quantisation) the tiny-model test shows agreement to 2e-2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from ruvllm.testing.isolation import NearTieRule
from ruvllm.testing.parity import PROMPTS, against_llama_cpp

LOGIT_BOUND = 2.0
#: Where llama.cpp's own top two are closer than this, rounding may pick either (measured widest
#: miss: 0.333); a wrong model misses by several logits.
NEAR_TIE = 0.5
TOKENS = 32


def _ref_logits(ll, ids):
    ll.reset()
    ll.eval(ids)
    return np.array(ll.scores[len(ids) - 1])


@pytest.fixture(scope="module")
def backend_default(embedded_source):
    """candle_like as `--backend candle_like` runs it here: the blocks on int8 activations
    (llama.cpp's own scheme) where the block kernel runs."""
    from ruvllm_candle_like.backend import CandleLikeBackend

    b = CandleLikeBackend.load(embedded_source, {})
    yield b
    b.close()


@pytest.fixture(scope="module", params=["backend_fp32", "backend_default"])
def first_step(request, reference_llama):
    backend = request.getfixturevalue(request.param)
    rows = []
    for prompt in PROMPTS:
        ids = backend.tokenizer.encode(prompt, parse_special=True)
        ref = _ref_logits(reference_llama, ids)
        ours = backend.step(backend.new_cache(len(ids)), ids).numpy()
        rows.append((ours, ref))
    return rows


def test_first_step_logits_agree(first_step):
    """Close logits everywhere, and the same top token unless llama.cpp itself is at a near-tie
    (the conformance suite's rule, with this comparison's bounds: the top-2 margin under
    NEAR_TIE and the rows within LOGIT_BOUND). On an AVX2 CPU llama.cpp's kernels move one
    prompt's top two (margin ~0.1) across each other; a wrong model misses by whole logits."""
    diffs = [float(np.abs(o - r).max()) for o, r in first_step]
    print("first-step max |logit diff| per prompt:", [round(d, 3) for d in diffs])
    assert max(diffs) < LOGIT_BOUND
    rule = NearTieRule(margin_bound=NEAR_TIE, distance_bound=LOGIT_BOUND)
    for i, (o, r) in enumerate(first_step):
        assert np.corrcoef(o, r)[0, 1] > 0.995
        divergence = rule.compare_row(0, r, o)
        assert divergence is None or divergence.allowed, f"prompt {PROMPTS[i]!r}: {divergence.describe()}"


@pytest.fixture(scope="module")
def backend_int4(embedded_source):
    """Every projection row on the int4 kernel (no dense copy) on float32 activations."""
    from ruvllm_candle_like.backend import CandleLikeBackend

    b = CandleLikeBackend.load(embedded_source, {"dtype": "float32", "int4_weights": True,
                                                 "dense_weights": False, "int8_activations": False})
    yield b
    b.close()


@pytest.mark.slow  # ~1-2 min of CPU each; `make test-all` runs it
@pytest.mark.parametrize("which", ["backend_fp32", "backend_int4", "backend_default"])
def test_greedy_matches_llama_cpp_teacher_forced(which, request, embedded_source):
    """8 prompts x 32 greedy positions, both engines fed llama.cpp's greedy prefix (see
    ruvllm.testing.parity for why teacher-forced, and benchmarks/parity_vs_llamacpp.py for the
    figures: float32 247/256 here, every miss at a llama.cpp margin below 0.34 logit; on the AVX2
    kind, 2026-12-06, float32 249/256 and int4 weights 248/256, widest miss 0.387 in both; on the
    AVX-512 kind, 2026-12-07, the default's int8 activations 245/256, widest miss 0.392)."""
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    backend = request.getfixturevalue(which)
    model = backend.model

    @torch.inference_mode()
    def logits(sequence, first):
        cache = backend.new_cache(len(sequence))
        cache.begin(len(sequence))
        return model.forward(torch.tensor(sequence), torch.arange(len(sequence)), cache,
                             torch.arange(first, len(sequence))).numpy()

    prompts = [backend.tokenizer.encode(p, parse_special=True) for p in PROMPTS]
    report = against_llama_cpp(embedded_source.path, prompts, logits, TOKENS)
    print(report.summary())
    problems = report.problems(expected_total=len(PROMPTS) * TOKENS, near_tie=NEAR_TIE, min_rate=0.9)
    assert not problems, problems
