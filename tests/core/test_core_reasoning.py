"""ruvllm.reasoning: thinking apart from the answer, the same whole and streamed in any pieces."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ruvllm.reasoning import THINK_TAGS, ReasoningSplitter, ReasoningTags, split_reasoning


@pytest.mark.parametrize(("text", "opened", "thinking", "answer"), [
    ("<think>\nLet me add.\n</think>\n\nIt is 4.", False, "Let me add.", "It is 4."),
    ("  <think>a</think>b", False, "a", "b"),
    ("<think></think>Answer", False, "", "Answer"),
    ("No thinking here.", False, None, "No thinking here."),
    # Whitespace before an answer without thinking is the answer's: left as the model wrote it.
    ("\n Plain <think>inside</think>", False, None, "\n Plain <think>inside</think>"),
    ("Let me add.\n</think>\n\nIt is 4.", True, "Let me add.", "It is 4."),
    ("Still thinking when max_tokens cut it", True, "Still thinking when max_tokens cut it", ""),
    ("<think>never closed <", False, "never closed <", ""),
    ("<thin", False, None, "<thin"),
    ("<think>a</think>b</think>c", False, "a", "b</think>c"),
    ("", False, None, ""),
    ("", True, "", ""),
])
def test_whole_outputs_split(text: str, opened: bool, thinking: str | None, answer: str) -> None:
    assert split_reasoning(text, opened=opened) == (thinking, answer)


def _streamed(pieces: list[str], opened: bool) -> tuple[str, str, bool]:
    splitter = ReasoningSplitter(THINK_TAGS, opened=opened)
    thinking, answer = "", ""
    for piece in [*pieces, None]:
        t, a = splitter.flush() if piece is None else splitter.feed(piece)
        thinking, answer = thinking + t, answer + a
    return thinking, answer, splitter.thinks


_ALPHABET = st.sampled_from(["<think>", "</think>", "<", "/", "think", ">", "\n", " ", "a", "b", "<th",
                             "nk>"])


@given(parts=st.lists(_ALPHABET, max_size=12), cuts=st.lists(st.integers(0, 80), max_size=6),
       opened=st.booleans())
def test_any_cut_of_the_stream_adds_up_to_the_whole_split(parts: list[str], cuts: list[int],
                                                         opened: bool) -> None:
    text = "".join(parts)
    bounds = sorted({0, len(text), *(c for c in cuts if c <= len(text))})
    pieces = [text[a:b] for a, b in itertools.pairwise(bounds)]
    thinking, answer, thinks = _streamed(pieces, opened)
    whole_thinking, whole_answer = split_reasoning(text, opened=opened)
    assert (thinking if thinks else None, answer) == (whole_thinking, whole_answer)


def test_thinking_streams_as_it_comes_and_only_a_cut_tag_is_held() -> None:
    splitter = ReasoningSplitter()
    assert splitter.feed("<think>\nFirst") == ("First", "")
    assert splitter.feed(" step </") == (" step", "")  # "</" may begin the end tag; " " the layout
    assert splitter.feed("think>\n\nDone") == ("", "Done")
    assert splitter.feed(" now.") == ("", " now.")
    assert splitter.flush() == ("", "")


def test_templates_and_prompts_are_recognised() -> None:
    assert THINK_TAGS.used_by("{% if x %}<think>{{ r }}</think>{% endif %}")
    assert not THINK_TAGS.used_by("{{ messages }}") and not THINK_TAGS.used_by(None)
    assert THINK_TAGS.opened_by("<|im_start|>assistant\n<think>\n")
    assert not THINK_TAGS.opened_by("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not THINK_TAGS.opened_by("<|im_start|>assistant\n")
    other = ReasoningTags("[THINK]", "[/THINK]")
    assert split_reasoning("[THINK]x[/THINK]y", other) == ("x", "y")
