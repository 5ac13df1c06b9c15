"""Stop strings matched across token boundaries, with OpenAI's semantics: neither the stop string
nor anything after it is emitted, and text held back as a possible stop prefix is released as
soon as it cannot become one."""

from __future__ import annotations

import random

import pytest
from ruvllm.stops import StopStringMatcher


def run(stops, deltas):
    m = StopStringMatcher(stops)
    pieces = [m.feed(d) for d in deltas]
    return pieces, m.flush(), m.matched


def test_stop_split_across_deltas():
    pieces, tail, matched = run(["###"], ["a#", "##b"])
    assert pieces == ["a", ""]
    assert tail == "" and matched == "###"


def test_stop_split_into_hash_and_double_hash():
    pieces, tail, matched = run(["###"], ["Answer: 4", "#", "##", " more"])
    assert "".join(pieces) + tail == "Answer: 4"
    assert pieces[1] == ""  # "#" is held back, not emitted
    assert matched == "###"


def test_held_back_prefix_released_when_it_is_not_a_stop():
    pieces, tail, matched = run(["###"], ["a#", "#", "b"])
    assert pieces == ["a", "", "##b"]
    assert matched is None and tail == ""


def test_flush_releases_a_dangling_prefix():
    pieces, tail, matched = run(["###"], ["x##"])
    assert pieces == ["x"]
    assert tail == "##" and matched is None


def test_flush_after_a_match_emits_nothing():
    m = StopStringMatcher(["STOP"])
    assert m.feed("hello ST") == "hello "
    assert m.feed("OP and then") == ""
    assert m.matched == "STOP"
    assert m.feed("more text") == ""
    assert m.flush() == ""


def test_text_after_the_stop_in_the_same_delta_is_dropped():
    pieces, tail, matched = run(["\n\n"], ["one\n\ntwo"])
    assert pieces == ["one"] and tail == "" and matched == "\n\n"


def test_earliest_of_several_stops_wins():
    pieces, _, matched = run(["END", "\n\n"], ["foo\n\nbarEND"])
    assert pieces == ["foo"] and matched == "\n\n"
    pieces, _, matched = run(["\n\n", "END"], ["fooEND\n\n"])
    assert pieces == ["foo"] and matched == "END"


def test_earliest_stop_across_deltas():
    pieces, tail, matched = run(["<|end|>", "User:"], ["Hi <|e", "nd|> User: x"])
    assert "".join(pieces) + tail == "Hi "
    assert matched == "<|end|>"


def test_no_stops_pass_everything_through():
    m = StopStringMatcher([])
    assert m.feed("a#") == "a#"
    assert m.flush() == "" and m.matched is None


def test_prefix_of_one_stop_is_held_only_as_long_as_needed():
    m = StopStringMatcher(["abc", "xyz"])
    assert m.feed("1a") == "1"
    assert m.feed("bx") == "ab"  # "abx" cannot be "abc"; "x" may still start "xyz"
    assert m.feed("yq") == "xyq"
    assert m.flush() == ""


def test_multibyte_stop_strings():
    pieces, tail, matched = run(["终止"], ["你好终", "止吧"])
    assert "".join(pieces) + tail == "你好" and matched == "终止"


@pytest.mark.parametrize("seed", range(40))
def test_random_chunkings_agree_with_a_whole_text_search(seed):
    rng = random.Random(seed)
    alphabet = "ab#\n xé"
    # No stop is a substring of another, so "first stop to complete" and "earliest stop in the
    # text" coincide and the answer cannot depend on where the deltas are cut.
    stops = rng.choice([["##"], ["ab#"], ["\n\n", "#a"], ["xé", "b b"], ["aaa", "#\n#"]])
    text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40)))
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(len(text) + 1, rng.randint(0, 8))))
    deltas = [text[i:j] for i, j in zip([0, *cuts], [*cuts, len(text)], strict=True)]
    pieces, tail, matched = run(stops, deltas)
    found = [(text.find(s), s) for s in stops if s in text]
    expected = text[: min(found)[0]] if found else text
    assert "".join(pieces) + tail == expected
    assert matched == (min(found)[1] if found else None)
