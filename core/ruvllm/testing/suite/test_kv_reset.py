"""Request isolation: no state from one ``generate()`` call may reach a later one.

ruvllm's ancestor had a backend whose ``clear_kv_cache()`` reset only the position: the first
request worked and every later one ran on top of the previous requests' KV. Each test here
makes a backend with that bug give a different greedy output (or a growing cache), so the bug
cannot pass conformance.
"""

from __future__ import annotations

import itertools

import attrs
import pytest

from ruvllm.llm import LLM
from ruvllm.models import ModelSource
from ruvllm.testing.kv_geometry import MIN_KV_BYTES_PER_ELEMENT, kv_geometry
from ruvllm.testing.memory_probe import growth_beyond_largest_step, heap_in_use_bytes, rss_bytes
from ruvllm.testing.support import (
    LOGPROB_TOLERANCE,
    LONG_PROMPT_TOKENS,
    MANY_CALLS,
    MANY_CALLS_TOKENS,
    MEDIUM,
    MEMORY_LEAK_SHARE,
    PROMPT_A,
    PROMPT_A_SIBLING,
    PROMPT_C,
    SHORT,
    describe,
    long_prompt,
    require,
)
from ruvllm.types import GenerationResult

MIB = 2**20
#: Tokens of each run of the shared-prefix test: enough for the sibling prompt's answer to show.
PREFIX_TOKENS = 8


@attrs.frozen
class ManyCalls:
    """What the state-growth tests assert on: one run of MANY_CALLS identical requests."""

    results: tuple[GenerationResult, ...]
    #: The backend's own report after each call (None: it cannot tell).
    cached_tokens: tuple[int | None, ...]
    #: The process's memory after each call, read from outside the backend: bytes the C
    #: allocator has handed out (None where it cannot be asked), and the resident set.
    heap: tuple[int | None, ...]
    rss: tuple[int | None, ...]

    def kept_tokens(self) -> int:
        """Tokens of KV that calls 2..MANY_CALLS would hold if none of them were released."""
        return sum(r.usage.prompt_tokens + r.usage.completion_tokens for r in self.results[1:])


@pytest.fixture(scope="session")
def many_calls(ruvllm_llm: LLM) -> ManyCalls:
    """Run PROMPT_A greedily MANY_CALLS times in a row, once per backend, recording the
    backend's cache size and the process's memory after each call (and the tokens'
    log-probabilities where the backend has them). Every state-growth test reads this one run."""
    llm = ruvllm_llm
    prompt = PROMPT_A
    logprobs = 0 if llm.capabilities.logprobs else None
    results, cached, heap, rss = [], [], [], []
    for _ in range(MANY_CALLS):
        results.append(llm.generate(prompt, max_tokens=MANY_CALLS_TOKENS, temperature=0.0, ignore_eos=True,
                                    logprobs=logprobs))
        cached.append(llm.backend.cached_tokens())
        heap.append(heap_in_use_bytes())
        rss.append(rss_bytes())
    return ManyCalls(tuple(results), tuple(cached), tuple(heap), tuple(rss))


class TestKvReset:
    def test_output_unchanged_after_long_prompt(self, ruvllm_llm: LLM) -> None:
        """Greedy A, then a long prompt B (hundreds of tokens), then A again: A's output is the
        same token for token. A backend that keeps B's KV continues A after B instead."""
        llm = ruvllm_llm
        prompt_b = long_prompt(llm.tokenizer, llm.info.context_length)
        before = llm.generate(PROMPT_A, max_tokens=SHORT)
        long_run = llm.generate(prompt_b, max_tokens=SHORT)
        after = llm.generate(PROMPT_A, max_tokens=SHORT)
        assert long_run.usage.prompt_tokens >= min(LONG_PROMPT_TOKENS, llm.info.context_length // 2)
        assert after.token_ids == before.token_ids, (
            f"prompt A's greedy output changed after a {long_run.usage.prompt_tokens}-token prompt: "
            f"state leaked between generate() calls.\n before: {describe(before)}\n after:  {describe(after)}"
        )
        assert after.text == before.text

    def test_alternating_prompts_repeat_exactly(self, ruvllm_llm: LLM) -> None:
        """A, C, A, C: every A equals the first A and every C equals the first C."""
        llm = ruvllm_llm
        runs = [llm.generate(p, max_tokens=SHORT) for p in (PROMPT_A, PROMPT_C, PROMPT_A, PROMPT_C)]
        assert runs[2].token_ids == runs[0].token_ids, (
            f"A changed after C ran: {describe(runs[0])} -> {describe(runs[2])}"
        )
        assert runs[3].token_ids == runs[1].token_ids, (
            f"C changed after A ran again: {describe(runs[1])} -> {describe(runs[3])}"
        )

    def test_abandoned_stream_leaves_no_state(self, ruvllm_llm: LLM) -> None:
        """A stream closed after two tokens (a client that disconnects) must release its
        state: the next request gives the same output as a fresh one."""
        llm = ruvllm_llm
        before = llm.generate(PROMPT_A, max_tokens=SHORT)
        stream = iter(llm.stream(PROMPT_C, max_tokens=MEDIUM, ignore_eos=True))
        next(stream)
        next(stream)
        stream.close()
        after = llm.generate(PROMPT_A, max_tokens=SHORT)
        assert after.token_ids == before.token_ids, (
            f"an abandoned stream changed the next request: {describe(before)} -> {describe(after)}"
        )

    def test_many_calls_identical_output(self, many_calls: ManyCalls) -> None:
        """Call 1 and call 50 (and every call between) give the same greedy output."""
        first = many_calls.results[0]
        for i, result in enumerate(many_calls.results[1:], start=2):
            assert result.token_ids == first.token_ids, (
                f"call {i} of {MANY_CALLS} differs from call 1: {describe(first)} -> {describe(result)}"
            )

    def test_many_calls_logprobs_unchanged(self, ruvllm_llm: LLM, many_calls: ManyCalls) -> None:
        """The last of the MANY_CALLS identical calls gives the first call's log-probabilities
        (within LOGPROB_TOLERANCE): state that builds up call after call and shifts the logits
        without flipping a greedy token shows here, whatever the backend reports about itself."""
        require(ruvllm_llm, "logprobs", "the engine does not expose token probabilities")
        first, last = many_calls.results[0].logprobs, many_calls.results[-1].logprobs
        assert first is not None and last is not None
        moved = [(i, a.logprob, b.logprob) for i, (a, b) in enumerate(zip(first, last, strict=True))
                 if abs(a.logprob - b.logprob) > LOGPROB_TOLERANCE]
        assert not moved, (
            f"call {MANY_CALLS} of {MANY_CALLS} identical calls gave other log-probabilities than call 1 "
            f"(more than {LOGPROB_TOLERANCE} apart): state accumulates across calls. "
            f"(position, call 1, call {MANY_CALLS}): {moved}"
        )

    def test_many_calls_cached_tokens_bounded(self, ruvllm_llm: LLM, many_calls: ManyCalls) -> None:
        """The state the backend reports holding between calls does not grow from call to call.

        This is the backend's own account (exact where the engine is asked, as llama.cpp's KV
        cells are); the memory and log-probability probes check the same run from outside."""
        readings = many_calls.cached_tokens
        if readings[0] is None:
            pytest.skip(f"{ruvllm_llm.backend_name} cannot report cached_tokens() (it returns None)")
        assert all(r is not None and r <= readings[0] for r in readings), (
            f"cached_tokens() grew across {MANY_CALLS} identical calls: {list(readings)}"
        )

    def test_many_calls_memory_bounded(self, ruvllm_model_source: ModelSource, many_calls: ManyCalls) -> None:
        """Memory does not grow with the number of calls, judged against what keeping the KV of
        calls 2..MANY_CALLS would add: their tokens times the model's KV bytes per token, read
        from the model file (not from the backend), at 2 bytes per element.

        The growth from call 1 to the last, less its single largest step between two calls
        (``growth_beyond_largest_step``), must stay under MEMORY_LEAK_SHARE of that leak: a leak
        counts by its total whatever its shape (every call, or in lumps every few calls), while
        one step is forgiven: a runtime may hold a buffer at some call boundaries and not at
        others (5.65 MiB on mistral.rs), which moves the last reading against the first by one
        step. The total must also stay under the whole leak (a one-off step that large is no
        allocator noise). Memory is the C allocator's bytes in use where it can
        be asked (a kept cache served from freed chunks does not move the resident set), else
        the resident set."""
        probes = [(name, readings) for name, readings in (("heap in use", many_calls.heap),
                                                          ("RSS", many_calls.rss))
                  if all(r is not None for r in readings)]
        if not probes:
            pytest.skip("process memory cannot be read on this platform (no glibc, /proc or psutil)")
        name, readings = probes[0]
        per_token = kv_geometry(ruvllm_model_source).bytes_per_token(MIN_KV_BYTES_PER_ELEMENT)
        kept = many_calls.kept_tokens()
        leak = kept * per_token
        calls = len(readings) - 1
        steps = [b - a for a, b in itertools.pairwise(readings)]
        grown = growth_beyond_largest_step(readings)
        total = readings[-1] - readings[0]
        largest = max(steps)
        rises = sum(s > 0.1 * leak / calls for s in steps)
        print(f"{name} over {calls} calls: total {total / MIB:.3f} MiB, largest step {largest / MIB:.3f} MiB "
              f"(call {steps.index(largest) + 2}), beyond it {grown / MIB:.3f} MiB; {rises} steps above a "
              f"tenth of one call's KV; a KV leak would add {leak / MIB:.1f} MiB")
        assert grown < MEMORY_LEAK_SHARE * leak and total < leak, (
            f"{name} grew by {grown / MIB:.2f} MiB over {calls} calls beyond its largest single step "
            f"({largest / MIB:.2f} MiB; limit {MEMORY_LEAK_SHARE:.0%} = {MEMORY_LEAK_SHARE * leak / MIB:.1f} "
            f"MiB), {total / MIB:.2f} MiB in all (limit {leak / MIB:.1f} MiB, what keeping the {kept} "
            f"tokens of KV of calls 2..{calls + 1} would add at {per_token} bytes per token), growing in "
            f"{rises} of the steps: memory is kept per request"
        )

    def test_prompts_sharing_a_prefix_stay_isolated(self, ruvllm_llm: LLM) -> None:
        """A prompt that starts like the previous one gives what it gives after an unrelated
        prompt. A prompt cache that keeps the previous call's KV when only the start of the
        prompts matches (not the whole common prefix) runs it on the other prompt's tokens."""
        llm = ruvllm_llm
        sibling, a = llm.encode(PROMPT_A_SIBLING), llm.encode(PROMPT_A)
        assert sibling[0] == a[0] and sibling != a
        llm.generate(PROMPT_C, max_tokens=1)  # an unrelated first token: nothing to reuse
        fresh = llm.generate(sibling, max_tokens=PREFIX_TOKENS)
        llm.generate(PROMPT_C, max_tokens=1)  # so that A itself runs clean (its KV is A's)
        llm.generate(a, max_tokens=PREFIX_TOKENS)
        after_a = llm.generate(sibling, max_tokens=PREFIX_TOKENS)
        assert after_a.token_ids == fresh.token_ids, (
            f"{PROMPT_A_SIBLING!r} changed when it followed {PROMPT_A!r}, which shares its first "
            f"tokens: state of the previous call was reused.\n after {PROMPT_C!r}: {describe(fresh)}\n "
            f"after {PROMPT_A!r}: {describe(after_a)}"
        )

    def test_logprobs_unchanged_by_earlier_requests(self, ruvllm_llm: LLM) -> None:
        """PROMPT_A's greedy tokens and their log-probabilities repeat (within LOGPROB_TOLERANCE)
        after another request. Equal tokens alone can hide state that shifts the logits: with
        rotary embeddings attention sees relative positions only, so a backend that clears the
        KV but lets positions keep counting across requests mostly picks the same tokens."""
        llm = ruvllm_llm
        require(llm, "logprobs", "the engine does not expose token probabilities")
        first = llm.generate(PROMPT_A, max_tokens=SHORT, logprobs=0)
        llm.generate(PROMPT_C, max_tokens=SHORT)
        again = llm.generate(PROMPT_A, max_tokens=SHORT, logprobs=0)
        assert again.token_ids == first.token_ids, f"{describe(first)} -> {describe(again)}"
        assert first.logprobs is not None and again.logprobs is not None
        moved = [(i, a.logprob, b.logprob) for i, (a, b) in enumerate(zip(first.logprobs, again.logprobs,
                                                                          strict=True))
                 if abs(a.logprob - b.logprob) > LOGPROB_TOLERANCE]
        assert not moved, (
            f"the same greedy tokens came with other log-probabilities after one more request (more "
            f"than {LOGPROB_TOLERANCE} apart): state of an earlier call reached the logits. "
            f"(position, first, again): {moved}"
        )
