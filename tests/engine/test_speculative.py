"""Speculative decoding (prompt lookup) in the engine, on fake models of both KV layouts.

The fake model here copies: its logits favour the token that followed the previous occurrence
of the last token, so prompt-lookup drafts are often right and sometimes wrong, and its logits
are a pure function of the history the executor holds. Any rejected draft whose KV was not
released (a block left in the table, a cell left in the sequence) fails the fakes' own checks
or changes the output, and with speculation the output must be token for token what it is
without (the sampler consumes its random numbers one per emitted token either way).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import attrs
import numpy as np
import pytest
from engine_fakes import VOCAB, FakeBackend, PagedFakeExecutor, PerSeqFakeExecutor, fake_logits
from prometheus_client.parser import text_string_to_metric_families
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.engine.ngram import PromptLookup
from ruvllm.engine.options import speculative_config_options
from ruvllm.engine.request import SchedRequest
from ruvllm.engine.speculative import PROBE_INTERVAL, Speculator
from ruvllm.engine.step_cost import PRIOR_COST, StepCostModel
from ruvllm.errors import EngineOptionError
from ruvllm.server.extensions.metrics import ServerMetrics
from ruvllm.types import GenerationParams
from scipy.stats import chi2_contingency


def copying_logits(history: Sequence[int]) -> np.ndarray:
    logits = fake_logits(history)
    last = history[-1]
    earlier = [i for i in range(len(history) - 1) if history[i] == last]
    if earlier:
        logits[history[earlier[-1] + 1]] += 2.5
    return logits


def _rows(history: Sequence[int], entry) -> list[np.ndarray]:
    end = entry.start_pos + len(entry.tokens)
    ends = range(entry.start_pos + 1, end + 1) if entry.all_logits else [end] if entry.sample else []
    return [copying_logits(history[:e]) for e in ends]


def _stack(rows: list[np.ndarray]) -> np.ndarray:
    return np.stack(rows) if rows else np.zeros((0, VOCAB), np.float32)


class PagedCopying(PagedFakeExecutor):
    prompt_logits = True

    def execute(self, batch):
        super().execute([attrs.evolve(e, sample=False) for e in batch])  # stores KV, checks tables
        rows: list[np.ndarray] = []
        for e in batch:
            end = e.start_pos + len(e.tokens)
            bs = self.block_size
            rows += _rows([int(self.kv[e.block_table[p // bs], p % bs]) for p in range(end)], e)
        return _stack(rows)


class PerSeqCopying(PerSeqFakeExecutor):
    prompt_logits = True

    def execute(self, batch):
        super().execute([attrs.evolve(e, sample=False) for e in batch])  # checks contiguous positions
        return _stack([r for e in batch for r in _rows(self.tokens(e.seq_id), e)])


PROMPTS = [[1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3], [9, 9, 10, 11, 9, 9, 10], [20, 21, 22, 23, 24, 25, 20],
           [5, 4, 3, 2, 1, 5, 4, 3, 2, 1, 5, 4, 3, 2]]
#: Fixed-length drafts: every request drafts whenever its tail matches, so rejections are many.
SPEC = {"speculative_method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1,
        "prompt_lookup_max": 3, "speculative_adaptive": False}


class FixedCost:
    """A step-cost model whose drafted tokens cost ``cost`` whatever the (fake, instant) steps take."""

    def __init__(self, cost: float):
        self.cost = cost

    def observe(self, tokens: int, seconds: float) -> None:
        pass

    def token_cost(self, batch_tokens: int) -> float:
        return self.cost


def run(executor_cls, params: GenerationParams, prompts=PROMPTS, **options):
    executor = executor_cls(num_blocks=64, block_size=4, max_batch_tokens=64, max_sequences=8)
    opts = EngineOptions(max_num_seqs=4, block_size=4, **options)
    with ServingEngine(FakeBackend(executor), opts) as eng:
        results = eng.generate_sync(prompts, params)
        snapshot = eng.metrics()
        blocks = eng._core.blocks
        blocks.check_invariants()
        assert blocks.num_used_blocks == 0, "a rejected draft's block leaked"
    if isinstance(executor, PerSeqFakeExecutor):
        assert executor.cells_used == 0 or all(len(s) % 4 == 0 for s in executor.seqs.values())
    return results, snapshot, executor


@pytest.mark.parametrize("executor_cls", [PagedCopying, PerSeqCopying])
@pytest.mark.parametrize("params", [
    GenerationParams(max_tokens=40, temperature=0.0, ignore_eos=True),
    GenerationParams(max_tokens=40, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True, logprobs=2),
    GenerationParams(max_tokens=40, temperature=0.7, top_k=5, seed=3, repetition_penalty=1.3,
                     frequency_penalty=0.2, logit_bias={4: 1.5}),
    GenerationParams(max_tokens=23, temperature=0.0, stop=["bcd"], ignore_eos=True),
], ids=["greedy", "top_p-logprobs", "penalties-bias", "stop"])
def test_output_is_what_it_is_without_speculation(executor_cls, params):
    plain, _, _ = run(executor_cls, params)
    spec, snap, _ = run(executor_cls, params, **SPEC)
    for a, b in zip(plain, spec, strict=True):
        assert b.token_ids == a.token_ids
        assert (b.text, b.finish_reason, b.stop_reason) == (a.text, a.finish_reason, a.stop_reason)
        assert b.logprobs == a.logprobs
    assert 0 < snap.spec_decode_accepted_tokens < snap.spec_decode_draft_tokens, snap
    assert sum(r.usage.draft_tokens for r in spec) == snap.spec_decode_draft_tokens
    assert sum(r.usage.accepted_draft_tokens for r in spec) == snap.spec_decode_accepted_tokens


def test_max_tokens_bounds_drafts():
    params = GenerationParams(max_tokens=7, temperature=0.0, ignore_eos=True)
    results, snap, _ = run(PerSeqCopying, params, **SPEC)
    assert [len(r.token_ids) for r in results] == [7] * len(PROMPTS)
    assert snap.spec_decode_drafts > 0


def drafted_with(steps, size: int) -> list[bool]:
    """Per step decoding ``size`` running sequences: whether any of them verified drafts (a
    request admitted in the same step adds a prompt chunk, which is not a decode)."""
    decodes = [[e for e in step if e.all_logits or len(e.tokens) == 1] for step in steps]
    return [any(e.all_logits for e in step) for step in decodes if len(step) == size]


def test_no_drafts_above_the_batch_threshold():
    params = GenerationParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    prompts = PROMPTS * 3  # more requests than run at once (4): steps of 4 until the queue drains
    executor = run(PagedCopying, params, prompts, **SPEC, speculative_disable_by_batch_size=4)[2]
    assert any(drafted_with(executor.steps, 4))
    executor = run(PagedCopying, params, prompts, **SPEC, speculative_disable_by_batch_size=3)[2]
    four = drafted_with(executor.steps, 4)
    assert four and not any(four)


def test_sampled_token_frequencies_match_without_speculation():
    """Two-sample chi-square test of the first 6 sampled tokens' joint frequencies' marginals,
    400 seeds without and 400 other seeds with speculation: a rule that kept drafts more (or
    less) often than the target model samples them fails at p < 1e-3; the exact rule passes
    (p below 1e-3 by chance once in a thousand runs per position; the seeds are fixed, so the
    outcome is reproducible)."""
    prompt = [[1, 2, 3, 4, 1, 2, 3, 4, 1, 2]]
    def tokens(seeds, **options):
        out = []
        for seed in seeds:
            params = GenerationParams(max_tokens=6, temperature=1.0, seed=seed, ignore_eos=True)
            out.append(run(PerSeqCopying, params, prompts=prompt, **options)[0][0].token_ids)
        return out
    plain = tokens(range(400))
    spec = tokens(range(1000, 1400), **SPEC)
    for pos in range(1, 6):
        a, b = Counter(t[pos] for t in plain), Counter(t[pos] for t in spec)
        keys = sorted(set(a) | set(b))
        table = np.array([[a[k] for k in keys], [b[k] for k in keys]])
        assert chi2_contingency(table).pvalue > 1e-3, (pos, dict(a), dict(b))


def test_prompt_lookup_prefers_the_longest_most_recent_match():
    lookup = PromptLookup(1, 3)
    #             0  1  2  3  4  5  6  7  8  9
    history = [7, 1, 2, 3, 9, 1, 2, 4, 5, 1, 2]
    assert lookup.propose(history, 3) == ((4, 5, 1), 2)  # "1 2" most recently followed by 4 5 1
    history += [3]  # tail "1 2 3": only at 1..3, followed by 9 1 2
    assert lookup.propose(history, 2) == ((9, 1), 3)
    assert lookup.propose([*history, 8], 2) == ((), 0)  # 8 occurs nowhere earlier
    assert PromptLookup(2, 2).propose([5, 6, 5, 6, 5], 4) == ((6, 5), 2)  # into the tail, stops at the end


def test_options_refuse_a_min_above_the_max():
    with pytest.raises(EngineOptionError, match="prompt_lookup_min"):
        EngineOptions(prompt_lookup_min=4, prompt_lookup_max=2)


def test_draft_length_follows_acceptance_and_cost():
    spec = Speculator(num_speculative_tokens=8, prompt_lookup_min=1, prompt_lookup_max=2,
                      disable_by_batch_size=4)
    spec.cost = FixedCost(0.5)
    tokens = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12] * 3
    req = SchedRequest("r", tokens, max_tokens=100)
    assert len(spec.propose(req, 8, 1)) == 1  # acceptance 1/2 at first: one token is worth it
    for _ in range(12):
        spec.record("r", 2, 2)
    assert len(spec.propose(req, 8, 1)) == 8  # a request that copies drafts many
    assert len(spec.propose(req, 3, 1)) == 3  # never more than the step allows
    # A new request whose tail matches as long starts from the engine's figure for that length.
    assert len(spec.propose(SchedRequest("new", tokens, max_tokens=100), 8, 1)) == 8
    for _ in range(30):
        spec.record("r", 1, 0)
    silent = [spec.propose(req, 8, 1) for _ in range(PROBE_INTERVAL)]
    assert [len(d) for d in silent] == [0] * (PROBE_INTERVAL - 1) + [1]  # failing drafts stop, then a probe
    assert spec.propose(SchedRequest("newer", tokens, max_tokens=100), 8, 1) == ()
    spec.cost = FixedCost(1.0)
    for _ in range(12):
        spec.record("r", 2, 2)
    assert spec.propose(req, 8, 1) == ()  # nothing is worth a token costing a whole step's time per token


def test_step_cost_is_learnt_from_decode_steps():
    model = StepCostModel()
    assert model.token_cost(1) == PRIOR_COST
    for tokens in [1, 2, 1, 4, 1, 3, 1, 6, 1, 2] * 3:
        model.observe(tokens, 0.010 + 0.005 * tokens)
    assert model.token_cost(1) == pytest.approx(0.005 / 0.015)
    # A big batch: a drafted token costs nearly what the step's tokens cost on average.
    assert model.token_cost(16) == pytest.approx(0.080 / 0.090)


def test_metrics_export_vllms_spec_decode_counters():
    params = GenerationParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    _, snap, _ = run(PagedCopying, params, **SPEC)
    text = ServerMetrics(lambda: snap, model_name="m", model="fake", backend="fake").render().decode()
    found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert found["ruvllm:spec_decode_num_drafts_total"] == snap.spec_decode_drafts > 0
    assert found["ruvllm:spec_decode_num_draft_tokens_total"] == snap.spec_decode_draft_tokens
    assert found["ruvllm:spec_decode_num_accepted_tokens_total"] == snap.spec_decode_accepted_tokens > 0


def test_speculative_config_maps_vllms_keys():
    options = speculative_config_options('{"method": "ngram", "num_speculative_tokens": 7, '
                                         '"prompt_lookup_max": 5, "disable_by_batch_size": 2}')
    assert EngineOptions.from_mapping(options).speculator().max_length == 7
    with pytest.raises(EngineOptionError, match=r"unknown key.*draft_model"):
        speculative_config_options('{"method": "ngram", "draft_model": "x"}')
    with pytest.raises(EngineOptionError, match="speculative_method"):
        EngineOptions.from_mapping(speculative_config_options('{"method": "eagle"}'))
