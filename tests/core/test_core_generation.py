"""RequestOutputBuilder and GenerationStream over a scripted token iterator (pure logic).

The fake iterator stands in for a backend's ``generate``: it yields fixed token ids and records
whether its ``finally`` ran, which is where a real backend frees the request's state.
"""

from __future__ import annotations

import pytest
from core_fakes import EOS, IM_END, ByteTokenizer, FakeTokenStream, text_ids
from ruvllm.errors import ContextLengthExceeded, InvalidRequest
from ruvllm.generation import GenerationStream, RequestOutputBuilder, check_prompt
from ruvllm.tokenizer import REPLACEMENT
from ruvllm.types import FinishReason, GenerationParams, SampledToken, Timings

TOK = ByteTokenizer()
PROMPT = text_ids("Q: ")


def run(token_ids, prompt=PROMPT, **params):
    fake = FakeTokenStream(token_ids, logprob=-0.5 if params.get("logprobs") is not None else None)
    stream = GenerationStream(iter(fake), RequestOutputBuilder(TOK, prompt, GenerationParams(**params)))
    outputs = list(stream)
    assert stream.result is not None
    return stream.result, outputs, fake


def test_max_tokens_0_never_asks_the_backend():
    result, outputs, fake = run(text_ids("hello"), max_tokens=0)
    assert result.finish_reason is FinishReason.LENGTH and result.token_ids == () and outputs == []
    assert fake.pulled == 0


def test_length_at_max_tokens():
    result, outputs, fake = run(text_ids("hello world"), max_tokens=5)
    assert result.finish_reason is FinishReason.LENGTH
    assert result.text == "hello" and len(result.token_ids) == 5
    assert fake.pulled == 5 and fake.released  # closed at once, not drained
    assert [o.index for o in outputs] == [0, 1, 2, 3, 4]


def test_stop_on_eos_id():
    result, _, fake = run([*text_ids("hi"), EOS, *text_ids("junk")])
    assert result.finish_reason is FinishReason.STOP
    assert result.stop_reason == EOS
    assert result.text == "hi"
    assert result.usage.completion_tokens == 3  # the EOS token is a generated token
    assert fake.pulled == 3 and fake.released


def test_every_eos_id_stops():
    result, _, _ = run([*text_ids("x"), IM_END, *text_ids("y")])
    assert result.finish_reason is FinishReason.STOP and result.stop_reason == IM_END


def test_stop_on_stop_token_ids():
    result, _, _ = run(text_ids("hey!more"), stop_token_ids=[ord("!")])
    assert result.finish_reason is FinishReason.STOP
    assert result.stop_reason == ord("!")
    assert result.text == "hey"


def test_stop_string_across_tokens():
    ids = TOK.encode_bytes(b"a#", cuts="pairs") + TOK.encode_bytes(b"#b", cuts="pairs")  # "a#" | "#b"
    result, outputs, fake = run([*ids, *text_ids("never")], stop=["##"])
    assert result.finish_reason is FinishReason.STOP
    assert result.stop_reason == "##"
    assert result.text == "a"
    assert [o.text for o in outputs] == ["a", ""]
    assert fake.pulled == 2 and fake.released


def test_ignore_eos_keeps_going_until_length():
    ids = [*text_ids("a"), EOS, *text_ids("bcdef")]
    result, _, _ = run(ids, ignore_eos=True, max_tokens=4)
    assert result.finish_reason is FinishReason.LENGTH
    assert result.token_ids == tuple(ids[:4])
    assert result.text == "abc"  # EOS is special: no text


def test_ignore_eos_still_honours_stop_token_ids():
    result, _, _ = run([*text_ids("a"), EOS], ignore_eos=True, stop_token_ids=[EOS])
    assert result.finish_reason is FinishReason.STOP and result.stop_reason == EOS


def test_usage_counts_real_tokens():
    prompt = text_ids("a longer prompt")
    result, _, _ = run(text_ids("out"), prompt=prompt, max_tokens=3)
    assert result.usage.prompt_tokens == len(prompt) == 15
    assert result.usage.completion_tokens == 3
    assert result.usage.total_tokens == 18


@pytest.mark.parametrize(
    ("text", "stop"),
    [("café 中文 😀 done", None), ("one # two ## three", ["###"]), ("emoji 😀😀 end", ["😀x"])],
)
def test_result_text_is_the_concatenation_of_streamed_texts(text, stop):
    ids = TOK.encode_bytes(text.encode(), cuts="pairs")
    result, outputs, _ = run(ids, stop=stop, max_tokens=len(ids))
    assert result.text == "".join(o.text for o in outputs) == text
    assert not any(REPLACEMENT in o.text for o in outputs)


def test_held_back_text_is_released_when_eos_ends_the_request():
    result, outputs, _ = run([*text_ids("a#"), EOS], stop=["##"])
    assert result.finish_reason is FinishReason.STOP
    assert result.text == "a#" == "".join(o.text for o in outputs)


def test_stop_string_and_max_tokens_on_the_same_token_is_a_stop():
    result, _, _ = run(text_ids("abXY"), stop=["XY"], max_tokens=4)
    assert result.finish_reason is FinishReason.STOP and result.text == "ab"


def test_closing_the_stream_early_cancels_and_releases_the_backend():
    fake = FakeTokenStream(text_ids("abcdefgh"))
    stream = GenerationStream(iter(fake), RequestOutputBuilder(TOK, PROMPT, GenerationParams()))
    it = iter(stream)
    assert next(it).text == "a"
    assert next(it).text == "b"
    it.close()
    assert fake.released
    assert stream.result is not None
    assert stream.result.finish_reason is FinishReason.CANCELLED
    assert stream.result.token_ids == tuple(text_ids("ab"))


def test_breaking_out_of_a_for_loop_cancels_too():
    fake = FakeTokenStream(text_ids("abcdefgh"))
    stream = GenerationStream(iter(fake), RequestOutputBuilder(TOK, PROMPT, GenerationParams()))
    for out in stream:
        if out.index == 2:
            break
    assert fake.released and stream.result.finish_reason is FinishReason.CANCELLED


def test_backend_ending_early_is_length_and_flushes_held_text():
    result, outputs, fake = run(text_ids("ab#"), stop=["##"], max_tokens=100)
    assert result.finish_reason is FinishReason.LENGTH
    assert outputs[-1].token_id is None and outputs[-1].text == "#"
    assert result.text == "ab#" == "".join(o.text for o in outputs)
    assert fake.released


def test_backend_ending_mid_character_flushes_a_replacement_char():
    ids = text_ids("ok") + list("😀".encode()[:3])
    result, _, _ = run(ids, max_tokens=100)
    assert result.finish_reason is FinishReason.LENGTH
    assert result.text == "ok" + REPLACEMENT == TOK.decode(ids)


def test_max_tokens_mid_character_flushes_a_replacement_char():
    ids = text_ids("ok") + list("😀".encode())
    result, _, _ = run(ids, max_tokens=3)
    assert result.text == "ok" + REPLACEMENT


def test_backend_error_marks_the_result_and_releases_the_backend():
    fake = FakeTokenStream(text_ids("abcdef"), fail_after=3)
    stream = GenerationStream(iter(fake), RequestOutputBuilder(TOK, PROMPT, GenerationParams()))
    seen = []
    with pytest.raises(RuntimeError, match="mid-request"):
        for out in stream:
            seen.append(out.text)
    assert seen == ["a", "b", "c"]
    assert fake.released
    assert stream.result.finish_reason is FinishReason.ERROR


def test_logprobs_are_reported_per_token_with_text():
    result, outputs, _ = run(text_ids("hé"), logprobs=1, max_tokens=3)
    assert result.logprobs is not None and len(result.logprobs) == 3
    assert [lp.token_id for lp in result.logprobs] == list(result.token_ids)
    assert all(lp.logprob == -0.5 for lp in result.logprobs)
    assert outputs[0].logprob == -0.5
    assert outputs[0].top_logprobs[0].text == "h"


def test_no_logprobs_unless_requested():
    result, outputs, _ = run(text_ids("hi"), max_tokens=2)
    assert result.logprobs is None and outputs[0].top_logprobs == ()


def test_timings_are_consistent():
    result, _, _ = run(text_ids("abc"), max_tokens=3)
    t = result.timings
    assert t.prefill >= 0 and t.decode >= 0 and t.queue == 0
    assert t.time_to_first_token == pytest.approx(t.prefill)


def test_collect_returns_the_result():
    fake = FakeTokenStream(text_ids("xyz"))
    stream = GenerationStream(iter(fake), RequestOutputBuilder(TOK, PROMPT, GenerationParams(max_tokens=2)))
    assert stream.collect().text == "xy"


def test_builder_used_directly_by_an_engine():
    b = RequestOutputBuilder(TOK, PROMPT, GenerationParams(max_tokens=10, stop=["!!"]))
    texts = [b.add(SampledToken(token_id=t)).text for t in text_ids("hi!")]
    assert texts == ["h", "i", ""] and not b.finished
    assert b.finish(FinishReason.LENGTH) == "!"
    assert b.result(timings=Timings()).text == "hi!"


# -- check_prompt ---------------------------------------------------------------------------------
def test_empty_prompt_is_rejected():
    with pytest.raises(InvalidRequest) as info:
        check_prompt([], GenerationParams(), context_length=100, vocab_size=10)
    assert info.value.field == "prompt" and "empty" in str(info.value)


@pytest.mark.parametrize("bad", [10, -1, 99])
def test_out_of_vocabulary_ids_are_rejected(bad):
    with pytest.raises(InvalidRequest) as info:
        check_prompt([1, bad, 2], GenerationParams(), context_length=100, vocab_size=10)
    assert info.value.field == "prompt" and info.value.value == bad
    assert str(bad) in str(info.value) and "[0, 10)" in str(info.value)


def test_context_length_exceeded_carries_the_numbers():
    with pytest.raises(ContextLengthExceeded) as info:
        check_prompt(list(range(8)), GenerationParams(max_tokens=5), context_length=12, vocab_size=10)
    err = info.value
    assert (err.prompt_tokens, err.max_tokens, err.context_length) == (8, 5, 12)
    assert "at most 4" in str(err)


def test_a_prompt_that_exactly_fits_is_accepted():
    check_prompt(list(range(8)), GenerationParams(max_tokens=4), context_length=12, vocab_size=10)


def test_stop_strings_are_matched_only_after_min_tokens():
    """vLLM's min_tokens: a stop string inside the first ``min_tokens`` tokens is text."""
    ids = text_ids("a.b.c.d")
    result, outputs, _ = run(ids, stop=["."], min_tokens=3)
    assert result.text == "a.b" and result.stop_reason == "."
    assert "".join(o.text for o in outputs) == result.text
    assert run(ids, stop=["."])[0].text == "a"


def test_include_stop_str_in_output_keeps_what_ended_the_answer():
    """vLLM's include_stop_str_in_output: the stop string, or a stop token's text, ends the text."""
    ids = text_ids("a.b.c")
    assert run(ids, stop=["."], include_stop_str_in_output=True)[0].text == "a."
    assert run(TOK.encode_bytes(b"a#", cuts="pairs") + TOK.encode_bytes(b"#b", cuts="pairs"), stop=["##"],
               include_stop_str_in_output=True)[0].text == "a##"
    dot = text_ids(".")[0]
    result, outputs, _ = run(ids, stop_token_ids=[dot], include_stop_str_in_output=True)
    assert result.text == "a." and result.stop_reason == dot
    assert "".join(o.text for o in outputs) == result.text
    # A special stop token (EOS) shows only where special tokens do.
    assert run([*text_ids("x"), EOS], include_stop_str_in_output=True)[0].text == "x"


def test_skip_special_tokens_false_shows_control_tokens_in_the_text():
    shown = run([*text_ids("x"), IM_END, *text_ids("y")], ignore_eos=True, stop_token_ids=[],
                skip_special_tokens=False, max_tokens=3)[0]
    hidden = run([*text_ids("x"), IM_END, *text_ids("y")], ignore_eos=True, max_tokens=3)[0]
    assert hidden.text == "xy" and shown.text == "x" + TOK.decode([IM_END], skip_special=False) + "y"
    ended = run([*text_ids("x"), EOS], skip_special_tokens=False, include_stop_str_in_output=True)[0]
    assert ended.text == "x" + TOK.decode([EOS], skip_special=False)
