"""``[engine] batch_invariant``: every greedy or seeded request answers, tokens and logprobs, exactly
what it answers alone, whatever runs beside it.

Runs on backends that claim the mode (``Capabilities.batch_invariant_mode``, or
``batch_invariant`` itself); the others skip saying so. The workload is the isolation workload
made adversarial: eight target requests (greedy and seeded, several sharing a long prefix) run
alone one by one, then all at once beside sixteen others (the same prefixes, so blocks come from
the prefix cache; some cancelled at once, some after their first token; longer ones holding KV),
in an engine whose step budget chunks every prompt and whose pool is too small for all of them,
so requests are preempted and recomputed. Exact equality is the claim; no near-tie rule applies.
"""

from __future__ import annotations

import threading

import pytest

from ruvllm.engine import ServingEngine
from ruvllm.errors import BatchInvariantUnsupported
from ruvllm.llm import LLM
from ruvllm.types import GenerationParams, GenerationResult

#: A shared head longer than a step's budget: every prompt is prefilled in chunks, and the
#: targets and the others beside them find its blocks in the prefix cache.
SHARED = ("You are a careful assistant. Answer briefly and precisely, and say so when you do not know "
          "the answer. Never invent facts. ")
QUESTIONS = ("What is the capital of France?", "Name a primary colour.", "Write a haiku about rain.",
             "How many legs has a spider?", "What is two plus two?", "Who wrote Hamlet?")
OTHERS = ("Once upon a time", "import numpy as np\n", "The quick brown fox", "SELECT name FROM")
#: Tokens per target: enough for drift to show, short enough for the suite's budget.
TARGET_TOKENS = 12
#: Tokens step budget: below every prompt's length, so prompts are prefilled in chunks.
STEP_TOKENS = 32
BLOCK = 16
#: Blocks the pool has beyond the longest request's: requests are admitted with their first
#: chunk's blocks, and two long ones growing at once run out of them, so one is preempted.
POOL_SPARE = 2


def _others() -> list[tuple[str, GenerationParams]]:
    """Sixteen requests beside the targets: the same shared head (prefix-cache hits) or other
    prompts, each longer than the last so that they hold KV while others come and go."""
    return [(SHARED + QUESTIONS[i % len(QUESTIONS)][::-1] if i % 2 else OTHERS[i % len(OTHERS)],
             GenerationParams(max_tokens=8 + 2 * i, temperature=0.0, ignore_eos=True)) for i in range(16)]


def _pool_blocks(llm: LLM) -> int:
    need = [-(-(len(llm.tokenizer.encode(text)) + params.max_tokens) // BLOCK)
            for text, params in _targets() + _others()]
    return max(need) + POOL_SPARE


def _targets() -> list[tuple[str, GenerationParams]]:
    greedy = GenerationParams(max_tokens=TARGET_TOKENS, temperature=0.0, logprobs=2)
    seeded = GenerationParams(max_tokens=TARGET_TOKENS, temperature=0.8, seed=7, logprobs=2)
    prompts = [SHARED + q for q in QUESTIONS] + list(OTHERS[:2])
    return [(p, seeded if i % 3 == 2 else greedy) for i, p in enumerate(prompts)]


@pytest.fixture(scope="module")
def engine(ruvllm_llm: LLM, ruvllm_engine_options):
    caps = ruvllm_llm.backend.capabilities()
    if not (caps.batch_invariant or caps.batch_invariant_mode):
        pytest.skip(f"{ruvllm_llm.backend.name} lacks batch_invariant_mode: its batched numerics depend "
                    "on the batch and it offers no mode that holds them")
    options = ruvllm_engine_options(batch_invariant=True, max_num_seqs=16, max_batch_tokens=STEP_TOKENS,
                                    block_size=BLOCK, num_blocks=_pool_blocks(ruvllm_llm),
                                    prefix_donor_slots=4)
    try:
        eng = ServingEngine(ruvllm_llm.backend, options, owns_backend=False)
    except BatchInvariantUnsupported as exc:
        pytest.skip(f"{ruvllm_llm.backend.name} refuses batch_invariant here: {exc}")
    try:
        yield eng
    finally:
        eng.close()


Request = tuple[list[int], GenerationParams]


def _together(engine: ServingEngine, targets: list[Request]) -> list[GenerationResult]:
    """The targets interleaved with the others, all queued before the model thread looks."""
    disturb = [(engine.encode(text), params) for text, params in _others()]
    gate = threading.Event()
    engine.call_future(gate.wait)
    try:
        handles, others, cancel_first_token = [], [], []
        for i, (prompt, params) in enumerate(disturb):
            if i < len(targets):
                handles.append(engine.submit_sync(*targets[i]))
            h = engine.submit_sync(prompt, params)
            others.append(h)
            if i % 4 == 1:
                h.cancel()
            elif i % 4 == 3:
                cancel_first_token.append(h)
    finally:
        gate.set()
    for h in cancel_first_token:
        next(iter(h), None)
        h.cancel()
    for h in others:
        h.result(timeout=600)
    return [h.result(timeout=600) for h in handles]


class TestBatchInvariance:
    def test_every_answer_is_the_one_given_alone(self, engine: ServingEngine) -> None:
        """Tokens and logprobs of each target, batched with cancellations, prefix-cache hits,
        chunked prefill and preemption, equal its solo run's bit for bit."""
        targets = [(engine.encode(text), params) for text, params in _targets()]
        alone = [engine.submit_sync(p, pa).result(timeout=600) for p, pa in targets]
        preempted = engine.metrics().preemptions
        together = _together(engine, targets)
        assert engine.metrics().preemptions > preempted, "nothing was preempted: the pool is too large"
        problems = []
        for (text, params), a, t in zip(_targets(), alone, together, strict=True):
            kind = "greedy" if params.temperature == 0 else f"seed {params.seed}"
            if t.token_ids != a.token_ids:
                problems.append(f"{kind} {text[-30:]!r}: batched {t.text!r} != alone {a.text!r}")
            elif t.logprobs != a.logprobs:
                pairs = zip(t.logprobs or (), a.logprobs or (), strict=True)
                at, (x, y) = next((k, xy) for k, xy in enumerate(pairs) if xy[0] != xy[1])
                problems.append(f"{kind} {text[-30:]!r}: same tokens, logprobs differ from token {at}: "
                                f"{x} != {y}")
        assert not problems, "batch_invariant does not hold:\n" + "\n".join(problems)
        assert engine.metrics().running == 0
