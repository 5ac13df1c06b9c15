"""Fill-in-the-middle tokens found by text, and the prefix-suffix-middle prompt (ruvllm.fim)."""

from __future__ import annotations

from ruvllm.fim import KNOWN_FIM_TOKENS, find_fim_tokens, infill_ids
from ruvllm.types import FimTokens


def test_each_known_family_is_found_and_a_partial_set_is_not():
    for texts in KNOWN_FIM_TOKENS:
        vocab = {t: 100 + i for i, t in enumerate(texts)}
        assert find_fim_tokens(vocab.get) == FimTokens(prefix=100, suffix=101, middle=102)
    two_of_three = {t: i for i, t in enumerate(KNOWN_FIM_TOKENS[0][:2])}
    assert find_fim_tokens(two_of_three.get) is None


def test_the_prompt_is_head_prefix_suffix_middle():
    fim = FimTokens(prefix=7, suffix=8, middle=9)
    assert infill_ids(fim, [1], [20, 21], [30]) == [1, 7, 20, 21, 8, 30, 9]
    assert infill_ids(fim, [], [], []) == [7, 8, 9]
