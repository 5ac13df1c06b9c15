"""Fill-in-the-middle tokens found by text, and the prefix-suffix-middle prompt (ruvllm.fim)."""

from __future__ import annotations

from ruvllm.fim import KNOWN_FIM_TOKENS, SNIPPET_MARKER, extra_pieces, find_fim_tokens, fit_infill, infill_ids
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


def test_a_family_with_repository_tokens_has_both_or_neither():
    qwen = [*KNOWN_FIM_TOKENS[0], "<|repo_name|>", "<|file_sep|>"]
    vocab = {t: 100 + i for i, t in enumerate(qwen)}
    assert find_fim_tokens(vocab.get) == FimTokens(prefix=100, suffix=101, middle=102, repo=103, file_sep=104)
    del vocab["<|file_sep|>"]
    assert find_fim_tokens(vocab.get) == FimTokens(prefix=100, suffix=101, middle=102)


def test_other_files_go_under_their_names_or_behind_a_marker():
    files = [("a.py", "x = 1\n"), ("b.py", "y = 2\n")]
    repo = FimTokens(prefix=7, suffix=8, middle=9, repo=5, file_sep=6)
    assert extra_pieces(repo, files) == [5, "myproject\n", 6, "a.py\n", "x = 1\n", 6, "b.py\n", "y = 2\n",
                                         6, "filename\n"]
    plain = FimTokens(prefix=7, suffix=8, middle=9)
    assert extra_pieces(plain, files) == [SNIPPET_MARKER, "x = 1\n", SNIPPET_MARKER, "y = 2\n"]
    assert extra_pieces(plain, []) == []


def test_the_editors_context_is_cut_as_llama_server_cuts_it():
    prefix, suffix, extra = list(range(2000)), list(range(1000)), list(range(9000))
    kept_prefix, kept_suffix, kept_extra = fit_infill(prefix, suffix, [1, 2], extra, context=8192,
                                                      max_tokens=100)
    assert kept_prefix == prefix[-1536:]  # three quarters of a 2048 batch, the end of the prefix
    assert kept_suffix == suffix[:508]  # the quarter left after the line and two tokens
    assert kept_extra == extra[-(8192 - 2048 - 200):]  # the end of the other files
    small = fit_infill(prefix, suffix, [], extra, context=1024, max_tokens=10)
    assert [len(part) for part in small] == [768, 254, 0]  # the batch is the context where smaller
    assert fit_infill([1], [2], [], [3], context=8192, max_tokens=10) == ([1], [2], [3])


def test_the_line_follows_the_prefix_and_other_files_come_first():
    fim = FimTokens(prefix=7, suffix=8, middle=9)
    assert infill_ids(fim, [1], [20], [30], line=[21], extra=[40, 41]) == [40, 41, 1, 7, 20, 21, 8, 30, 9]
