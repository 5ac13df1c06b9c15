"""llama.cpp's fill-in-the-middle sampler (ruvllm.infill_sampling), case by case as its C code
decides, and through core's Sampler."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.infill_sampling import InfillFilter
from ruvllm.sampling import Sampler
from ruvllm.types import GenerationParams

EOS = 2
PIECES = {10: b"ret", 11: b"return", 12: b"x", 13: b"y", 14: b"z", 15: b"w", 16: b"v", 17: b"u", EOS: b""}


def _filter(ids, probs):
    out_ids, out_probs = InfillFilter([EOS], PIECES.__getitem__)(np.asarray(ids), np.asarray(probs, float))
    return dict(zip(out_ids.tolist(), np.round(out_probs, 6).tolist(), strict=True))


def test_probable_enough_end_tokens_are_all_that_remain():
    # 3 * 0.15 * 3 candidates = 1.35 > the text's 0.85
    assert _filter([11, 12, EOS], [0.6, 0.25, 0.15]) == {EOS: 1.0}
    # 3 * 0.05 * 3 = 0.45 < 0.95: the text goes on; "x" passes 0.2 but not 1 / (2 kept + 1).
    assert _filter([11, 12, EOS], [0.7, 0.25, 0.05]) == {11: round(0.7 / 0.75, 6), EOS: round(0.05 / 0.75, 6)}


def test_a_token_that_starts_another_gives_its_mass_to_the_more_probable():
    # "ret" starts "return": "return" (0.5) takes "ret"'s 0.3; "x" (0.2) passes 0.2, then falls under 1/3.
    assert _filter([11, 10, 12, EOS], [0.5, 0.3, 0.2, 0.0]) == {11: 1.0, EOS: 0.0}
    # The other way round, "ret" is the more probable and keeps both.
    assert _filter([10, 11, 12, EOS], [0.5, 0.3, 0.2, 0.0]) == {10: 1.0, EOS: 0.0}


def test_when_no_text_is_probable_enough_the_answer_ends():
    texts = [12, 13, 14, 15, 16, 17]
    assert _filter([*texts, EOS], [0.165] * 6 + [0.01]) == {EOS: 1.0}


def test_the_sampler_applies_it_after_top_k_and_only_when_asked():
    logits = np.full(20, -30.0, dtype=np.float32)
    logits[[11, 12, EOS]] = np.log([0.6, 0.25, 0.15])
    params = GenerationParams(temperature=1.0, top_k=3, infill_sampling=True)
    chosen = {Sampler(attrs.evolve(params, seed=s), 20, end_ids=[EOS], token_bytes=PIECES.get).sample(logits)
              .token_id for s in range(20)}
    assert chosen == {EOS}
    plain = {Sampler(GenerationParams(temperature=1.0, top_k=3, seed=s), 20).sample(logits).token_id
             for s in range(20)}
    assert plain - {EOS}, "without the infill rule the text is sampled too"
    with pytest.raises(InvalidRequest, match="infill_sampling"):
        Sampler(params, 20, end_ids=[EOS])
