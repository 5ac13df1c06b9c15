"""What a request returns: streamed text, lengths, finish reasons, usage and logprobs.

These are decided by core for every backend, so a failure here usually means the backend
yields something other than what it sampled (extra tokens, a token before the prompt was
consumed, an EOS id that is not the model's).
"""

from __future__ import annotations

import math

import pytest

from ruvllm.llm import LLM
from ruvllm.testing.support import (
    CHAT_SHORT_REPLY,
    MEDIUM,
    NEVER_GENERATED,
    PROMPT_A,
    PROMPT_C,
    SHORT,
    describe,
    require,
    stop_across_boundary,
    stop_inside_text,
)
from ruvllm.tokenizer import REPLACEMENT
from ruvllm.types import FinishReason

#: Tokens allowed for the model to end a short chat reply with EOS.
EOS_BUDGET = 64
#: How far past its EOS ``min_tokens`` asks the short reply to go.
MIN_TOKENS_PAST_EOS = 4


class TestOutputs:
    def test_stream_equals_generate(self, ruvllm_llm: LLM) -> None:
        """Streamed pieces concatenate to the non-streamed text; their token ids are the
        result's; the text is the tokenizer's decoding of those ids."""
        llm = ruvllm_llm
        plain = llm.generate(PROMPT_C, max_tokens=MEDIUM, ignore_eos=True)
        stream = llm.stream(PROMPT_C, max_tokens=MEDIUM, ignore_eos=True)
        pieces = list(stream)
        assert stream.result is not None
        assert "".join(p.text for p in pieces) == plain.text
        assert stream.result.text == plain.text
        assert tuple(p.token_id for p in pieces if p.token_id is not None) == plain.token_ids
        assert [p.index for p in pieces if p.token_id is not None] == list(range(len(plain.token_ids)))
        assert plain.text == llm.tokenizer.decode(list(plain.token_ids))

    def test_max_tokens_gives_exact_length(self, ruvllm_llm: LLM) -> None:
        """max_tokens=N with ignore_eos: exactly N tokens, finish reason ``length``."""
        for n in (1, SHORT):
            result = ruvllm_llm.generate(PROMPT_A, max_tokens=n, ignore_eos=True)
            assert len(result.token_ids) == n, describe(result)
            assert result.usage.completion_tokens == n
            assert result.finish_reason is FinishReason.LENGTH

    @pytest.mark.parametrize("where", ["inside-text", "across-token-boundary"])
    def test_stop_string_truncates(self, ruvllm_llm: LLM, where: str) -> None:
        """A stop string taken from the model's own greedy output ends the request there:
        the text is everything before it, without it, and the finish reason is ``stop``.
        The ``across-token-boundary`` case starts the stop string in one token and ends it in
        the next, which only matching on text (not per token) catches."""
        llm = ruvllm_llm
        full = llm.generate(PROMPT_A, max_tokens=MEDIUM, ignore_eos=True)
        if where == "inside-text":
            stop = stop_inside_text(full.text)
        else:
            stop = stop_across_boundary(llm.tokenizer, list(full.token_ids), full.text)
        if stop is None:
            pytest.skip(f"{llm.backend_name}'s greedy output has no usable stop string {where}: "
                        f"{full.text!r}")
        expected = full.text[: full.text.find(stop)]
        stream = llm.stream(PROMPT_A, max_tokens=MEDIUM, ignore_eos=True, stop=[stop])
        streamed = "".join(p.text for p in stream)
        result = stream.result
        assert result is not None
        assert result.finish_reason is FinishReason.STOP, f"stop {stop!r}: {describe(result)}"
        assert result.stop_reason == stop
        assert stop not in result.text
        assert result.text == expected, f"stop {stop!r}: {result.text!r} != {expected!r}"
        assert streamed == result.text
        assert full.token_ids[: len(result.token_ids)] == result.token_ids

    def test_max_tokens_releases_held_back_stop_prefix(self, ruvllm_llm: LLM) -> None:
        """A request that reaches max_tokens while its text ends with the start of a stop string
        (held back in case the next token completes it) still delivers that text, streamed and
        in the result: the stop string never happened. Streaming that holds back tokens for a
        possible stop and ends on its own max_tokens count loses them."""
        llm = ruvllm_llm
        full = llm.generate(PROMPT_A, max_tokens=SHORT, ignore_eos=True)
        tail = full.text.rstrip(REPLACEMENT)[-3:]
        if not tail:
            pytest.skip(f"{llm.backend_name}'s greedy output ends without text to hold back: {full.text!r}")
        stop = tail + NEVER_GENERATED
        stream = llm.stream(PROMPT_A, max_tokens=SHORT, ignore_eos=True, stop=[stop])
        streamed = "".join(p.text for p in stream)
        result = stream.result
        assert result is not None
        assert result.finish_reason is FinishReason.LENGTH, f"stop {stop!r}: {describe(result)}"
        assert result.token_ids == full.token_ids, f"stop {stop!r}: {describe(result)} != {describe(full)}"
        assert result.text == full.text, f"stop {stop!r}: the held-back {tail!r} was not released"
        assert streamed == full.text, f"stop {stop!r}: streamed {streamed!r} != {full.text!r}"

    def test_stop_token_id_ends_request(self, ruvllm_llm: LLM) -> None:
        """A stop token id (here the 6th greedy token) ends the request on that token."""
        llm = ruvllm_llm
        full = llm.generate(PROMPT_A, max_tokens=SHORT, ignore_eos=True)
        stop_id = full.token_ids[5]
        cut = full.token_ids.index(stop_id)
        result = llm.generate(PROMPT_A, max_tokens=SHORT, ignore_eos=True, stop_token_ids=[stop_id])
        assert result.finish_reason is FinishReason.STOP
        assert result.stop_reason == stop_id
        assert result.token_ids == full.token_ids[: cut + 1]

    def test_eos_finishes_with_stop(self, ruvllm_llm: LLM) -> None:
        """A short chat reply ends with one of the model's EOS ids: finish ``stop``, the EOS id
        is the last token and its text is not in the output. With ignore_eos the same tokens
        come out and generation goes on past the EOS."""
        llm = ruvllm_llm
        prompt = llm.chat_prompt(CHAT_SHORT_REPLY)
        eos_ids = set(llm.tokenizer.eos_ids)
        assert eos_ids, f"{llm.backend_name}'s tokenizer declares no EOS id"
        through = llm.generate(prompt, max_tokens=EOS_BUDGET, ignore_eos=True)
        at = next((i for i, t in enumerate(through.token_ids) if t in eos_ids), None)
        assert at is not None, (
            f"no EOS id {sorted(eos_ids)} in {EOS_BUDGET} greedy tokens of a one-word chat reply: "
            f"the EOS ids the backend reports are probably not the model's. {describe(through)}"
        )
        result = llm.generate(prompt, max_tokens=EOS_BUDGET)
        assert result.finish_reason is FinishReason.STOP, describe(result)
        assert result.token_ids == through.token_ids[: at + 1]
        assert result.stop_reason == through.token_ids[at]
        assert result.text == llm.tokenizer.decode(list(through.token_ids[:at]))
        assert len(through.token_ids) == EOS_BUDGET, "ignore_eos=True still stopped at EOS"

    def test_min_tokens_keeps_the_end_out(self, ruvllm_llm: LLM) -> None:
        """vLLM's ``min_tokens``: the short chat reply above, asked for a few tokens past where it
        ended, comes out the same up to its EOS and then goes on (no EOS among the first
        ``min_tokens``). A backend whose generate() samples without telling core's sampler the
        end ids refuses instead; one that ignores the field stops at the same EOS and fails."""
        llm = ruvllm_llm
        require(llm, "core_sampler", "the engine samples by itself and has no minimum length")
        prompt = llm.chat_prompt(CHAT_SHORT_REPLY)
        eos_ids = set(llm.tokenizer.eos_ids)
        ended = llm.generate(prompt, max_tokens=EOS_BUDGET)
        assert ended.finish_reason is FinishReason.STOP and ended.token_ids[-1] in eos_ids, describe(ended)
        at = len(ended.token_ids) - 1
        longer = llm.generate(prompt, max_tokens=EOS_BUDGET, min_tokens=at + MIN_TOKENS_PAST_EOS)
        assert longer.token_ids[:at] == ended.token_ids[:at], f"{describe(ended)} / {describe(longer)}"
        assert len(longer.token_ids) >= at + MIN_TOKENS_PAST_EOS, describe(longer)
        assert not eos_ids & set(longer.token_ids[:at + MIN_TOKENS_PAST_EOS]), describe(longer)

    def test_usage_counts_real_tokens(self, ruvllm_llm: LLM) -> None:
        """usage.prompt_tokens is the prompt's token count, completion_tokens the number of
        generated ids; for a text prompt and for a chat prompt."""
        llm = ruvllm_llm
        ids = llm.encode(PROMPT_A)
        result = llm.generate(PROMPT_A, max_tokens=SHORT)
        assert result.usage.prompt_tokens == len(ids)
        assert result.usage.completion_tokens == len(result.token_ids)
        assert result.usage.total_tokens == len(ids) + len(result.token_ids)
        chat_ids = llm.chat_prompt(CHAT_SHORT_REPLY)
        chat = llm.chat(CHAT_SHORT_REPLY, max_tokens=SHORT)
        assert chat.usage.prompt_tokens == len(chat_ids)
        assert chat.usage.completion_tokens == len(chat.token_ids)

    def test_logprobs(self, ruvllm_llm: LLM) -> None:
        """logprobs=5: every token has a log-probability <= 0 and 5 alternatives in
        descending order; under greedy decoding the chosen token is the most likely one."""
        llm = ruvllm_llm
        require(llm, "logprobs", "the engine does not expose token probabilities")
        k = 5
        stream = llm.stream(PROMPT_A, max_tokens=SHORT, logprobs=k, ignore_eos=True)
        outputs = [o for o in stream if o.token_id is not None]
        result = stream.result
        assert result is not None and result.logprobs is not None
        assert [lp.token_id for lp in result.logprobs] == list(result.token_ids)
        for out in outputs:
            assert out.logprob is not None and out.logprob <= 1e-6
            assert len(out.top_logprobs) == k
            values = [t.logprob for t in out.top_logprobs]
            assert values == sorted(values, reverse=True)
            # Greedy picks a most likely token; where several tie exactly (bf16 rows do), the
            # listing may put its twin first, but the chosen one must be listed at the same value.
            best = [t for t in out.top_logprobs if math.isclose(t.logprob, values[0], abs_tol=1e-6)]
            assert out.token_id in [t.token_id for t in best], (out.token_id, out.top_logprobs)
            assert math.isclose(out.top_logprobs[0].logprob, out.logprob, abs_tol=1e-4)
        without = llm.generate(PROMPT_A, max_tokens=SHORT, ignore_eos=True)
        assert without.logprobs is None
        assert without.token_ids == result.token_ids, "asking for logprobs changed the tokens"
