"""Draft-model speculation's engine logic, on fake models of both KV layouts.

The target copies (test_speculative's copying logits); the draft is the plain fake model, which
agrees with it now and then: its drafts are sometimes kept and often rejected, so the draft's
rejected tails must be cut back (blocks, cells) and caught up correctly, or its later drafts and
the cell checks of the fake executors go wrong. The output must be what plain decoding gives.
"""

from __future__ import annotations

import pytest
from engine_fakes import FakeBackend, FakeTokenizer, PagedFakeExecutor, PerSeqFakeExecutor
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.engine.draft_model import DraftModel, DraftModelSpeculator, vocabulary_difference
from ruvllm.engine.options import speculative_config_options
from ruvllm.engine.request import SchedRequest
from ruvllm.engine.speculative import PROBE_INTERVAL
from ruvllm.errors import DraftVocabularyMismatch, EngineOptionError
from ruvllm.types import GenerationParams
from test_speculative import PROMPTS, PagedCopying, PerSeqCopying

DRAFT = {"speculative_method": "draft_model", "speculative_model": "fake-draft", "num_speculative_tokens": 3,
         "speculative_adaptive": False}


def run(target_cls, draft_cls, params, prompts=PROMPTS, **options):
    target = target_cls(num_blocks=64, block_size=4, max_batch_tokens=64, max_sequences=8)
    draft_executor = draft_cls(num_blocks=64, block_size=4, max_batch_tokens=16, max_sequences=8)
    opts = EngineOptions(max_num_seqs=4, block_size=4, **options)
    with ServingEngine(FakeBackend(target), opts, draft=FakeBackend(draft_executor)) as eng:
        results = eng.generate_sync(prompts, params)
        snapshot = eng.metrics()
        assert eng._core.blocks.num_used_blocks == 0
        speculator = eng._core.speculator
        draft = speculator.draft if isinstance(speculator, DraftModelSpeculator) else None
        if draft is not None:
            draft.blocks.check_invariants()
            assert draft.blocks.num_used_blocks == 0, "a finished request's draft blocks leaked"
            assert draft.num_sequences == 0
    if isinstance(draft_executor, PerSeqFakeExecutor) and draft is not None:
        assert draft_executor.cells_used == 0, "a finished request's draft cells leaked"
    return results, snapshot


@pytest.mark.parametrize("target_cls", [PagedCopying, PerSeqCopying])
@pytest.mark.parametrize("draft_cls", [PagedFakeExecutor, PerSeqFakeExecutor])
@pytest.mark.parametrize("params", [
    GenerationParams(max_tokens=30, temperature=0.0, ignore_eos=True),
    GenerationParams(max_tokens=30, temperature=0.9, top_p=0.9, seed=5, ignore_eos=True, logprobs=2),
], ids=["greedy", "top_p-logprobs"])
def test_output_is_what_it_is_without_speculation(target_cls, draft_cls, params):
    plain, _ = run(target_cls, draft_cls, params)
    spec, snap = run(target_cls, draft_cls, params, **DRAFT)
    for a, b in zip(plain, spec, strict=True):
        assert (b.token_ids, b.text, b.logprobs) == (a.token_ids, a.text, a.logprobs)
    assert 0 < snap.spec_decode_accepted_tokens < snap.spec_decode_draft_tokens, snap
    assert sum(r.usage.accepted_draft_tokens for r in spec) == snap.spec_decode_accepted_tokens


def test_preempted_and_cancelled_requests_free_their_draft_sequences():
    """A target with room for few blocks preempts; every request's draft KV goes with it."""
    target = PerSeqCopying(num_blocks=14, block_size=4, max_batch_tokens=64, max_sequences=8)
    draft_executor = PerSeqFakeExecutor(num_blocks=64, block_size=4, max_batch_tokens=16, max_sequences=8)
    params = GenerationParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    opts = EngineOptions(max_num_seqs=4, block_size=4, watermark=0.0, **DRAFT)
    with ServingEngine(FakeBackend(target), opts, draft=FakeBackend(draft_executor)) as eng:
        handles = [eng.submit_sync(p, params) for p in PROMPTS]
        results = [h.result() for h in handles]
        assert eng.metrics().preemptions > 0
        draft = eng._core.speculator.draft
        assert draft.num_sequences == 0 and draft.blocks.num_used_blocks == 0
    assert draft_executor.cells_used == 0
    draft_executor = PerSeqFakeExecutor(num_blocks=64, block_size=4, max_batch_tokens=16, max_sequences=8)
    with ServingEngine(FakeBackend(PerSeqCopying(num_blocks=64, block_size=4, max_batch_tokens=64)),
                       EngineOptions(max_num_seqs=4, block_size=4, **DRAFT),
                       draft=FakeBackend(draft_executor)) as eng:
        params = GenerationParams(max_tokens=200, temperature=0.0, ignore_eos=True)
        handle = eng.submit_sync(PROMPTS[0], params)
        for _ in handle:
            handle.cancel()
            break
        handle.result()
        draft = eng._core.speculator.draft
        assert eng.call(lambda: (draft.num_sequences, draft.blocks.num_used_blocks)) == (0, 0)
    assert draft_executor.cells_used == 0
    assert [len(r.token_ids) for r in results] == [20] * len(PROMPTS)


def test_a_draft_that_costs_a_whole_step_is_not_used():
    """The draft model's own time enters a drafted token's cost: drafts from a model as slow as
    the target never pay, from a ten times cheaper one they do."""
    def speculator(draft_seconds: float) -> DraftModelSpeculator:
        draft = DraftModel(FakeBackend(), PerSeqFakeExecutor(), max_sequences=4, vocab_size=40)
        spec = DraftModelSpeculator(draft, num_speculative_tokens=8, disable_by_batch_size=4)
        for tokens in [1, 2, 3, 4] * 4:  # the target: 10 ms + 1 ms per token
            spec.cost.observe(tokens, 0.010 + 0.001 * tokens)
        draft.cost.observe(1, draft_seconds)
        return spec

    req = SchedRequest("r", [1, 2, 3, 4, 5], max_tokens=50)
    cheap = speculator(0.0011)
    cheap.prepare([req], 1)
    assert len(cheap.propose(req, 8, 1)) >= 2
    costly = speculator(0.011)
    for _ in range(PROBE_INTERVAL + 1):  # not even a probe: no acceptance could pay for it
        costly.prepare([req], 1)
        assert costly.propose(req, 8, 1) == ()


class OtherTokenizer(FakeTokenizer):
    def token_text(self, token_id: int) -> str:
        return "other" if token_id == 7 else super().token_text(token_id)


class OtherVocabulary(FakeBackend):
    @property
    def tokenizer(self) -> FakeTokenizer:
        return OtherTokenizer()


def test_a_draft_with_another_vocabulary_is_refused():
    assert vocabulary_difference(FakeBackend(), FakeBackend()) is None
    differs = r"token 7 is 'h' in the target and 'other' in the draft"
    with pytest.raises(DraftVocabularyMismatch, match=differs):
        ServingEngine(FakeBackend(PagedCopying()), EngineOptions(**DRAFT),
                      draft=OtherVocabulary(PagedFakeExecutor()))


def test_options_need_the_draft_model_and_map_vllms_keys():
    with pytest.raises(EngineOptionError, match="speculative_model"):
        EngineOptions(speculative_method="draft_model")
    options = speculative_config_options('{"method": "draft_model", "model": "m.gguf", '
                                         '"num_speculative_tokens": 5, "draft_backend": "llamacpp"}')
    opts = EngineOptions.from_mapping(options)
    assert (opts.speculative_model, opts.speculative_draft_backend, opts.num_speculative_tokens) == \
        ("m.gguf", "llamacpp", 5)
