"""Proof against llama.cpp: greedy output on the embedded model, 8 prompts x 32 tokens.

Exact token equality is not the criterion, and here is why (measured, docs/backends/mlx.md):
llama.cpp quantizes activations to 8 bits inside its Q4_1/Q8_0 dot products and keeps K/V in
float16, while this backend computes in float32 on dequantized weights. Logits differ by up
to ~1-2 on this 135M model, and llama.cpp disagrees with *itself* by up to ~0.15 logit between
its batched prefill and its token-by-token decode. So every position is compared teacher-forced
(ruvllm.testing.parity: both engines see llama.cpp's greedy prefix) and:

- MLX's top-1 must equal llama.cpp's at >= 90% of the 256 positions (measured: 247/256);
- wherever they differ, llama.cpp's own margin between the two tokens must be below
  ``NEAR_TIE`` logits (measured widest: 0.333): a near-tie that float rounding may break either
  way, never a real error.

A broken model (wrong rope, transposed weights, bad dequantization) fails both at once.
"""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm.testing.parity import PROMPTS, against_llama_cpp
from ruvllm_mlx.model import Segment

TOKENS = 32
NEAR_TIE = 0.5


@pytest.mark.slow  # ~1-2 min of CPU; `make test-all` runs it
def test_greedy_matches_llama_cpp_teacher_forced(backend, model_path):
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")

    def logits(sequence, first):
        cache = backend.model.new_cache()
        rows = list(range(first, len(sequence)))
        return np.array(backend.model.forward(sequence, [Segment(cache, 0, len(sequence))], rows))

    prompts = [backend.tokenizer.encode(p, parse_special=True) for p in PROMPTS]
    report = against_llama_cpp(model_path, prompts, logits, TOKENS)
    print(report.summary())
    problems = report.problems(expected_total=len(PROMPTS) * TOKENS, near_tie=NEAR_TIE, min_rate=0.9)
    assert not problems, problems
