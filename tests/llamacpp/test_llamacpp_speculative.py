"""Prompt-lookup speculation on the llama.cpp executor and the embedded model.

Rejected drafts leave cells in llama.cpp's unified pool unless the engine trims them
(``llama_memory_seq_rm``); a cell left behind puts two cells at one position of a sequence,
which changes its attention (or makes llama_decode refuse the batch). llama.cpp's logits of a
position verified in a chunk of drafts differ slightly from a one-token decode's, so greedy
output is compared with plain decoding's under the isolation rule (docs/conformance.md): the
tokens are the same until a position where plain decoding's row had a near-tie.
"""

from __future__ import annotations

import re

import pytest
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.guided import guided_processor
from ruvllm.guided.grammar import GrammarSpec
from ruvllm.testing.isolation import LogitsRecorder, NearTieRule
from ruvllm.testing.speculative import COPY_PROMPT, FIXED_DRAFTS, SELF_DRAFT
from ruvllm.types import GenerationParams

ruvllm_llamacpp = pytest.importorskip("ruvllm_llamacpp")

FREE = "Once upon a time, in a small village,"
SPEC = EngineOptions(max_num_seqs=4, **FIXED_DRAFTS)


@pytest.fixture(scope="module")
def backend(model_path, test_options):
    from ruvllm.models import ModelSource

    b = ruvllm_llamacpp.LlamaCppBackend.load(ModelSource.from_path(model_path), test_options)
    yield b
    b.close()


GREEDY = GenerationParams(max_tokens=36, temperature=0.0, ignore_eos=True)
PROMPTS = [COPY_PROMPT, FREE]


def recorded(backend, options, prompts, params, check=None, predictions=None):
    """Results, logits recorders and metrics; ``check(engine)`` runs before the engine closes;
    ``predictions``: each prompt's predicted output (token ids)."""
    with ServingEngine(backend, options, owns_backend=False) as eng:
        recorders = [LogitsRecorder() for _ in prompts]
        handles = [eng.submit_sync(eng.encode(p), params, logits_processors=[r], prediction=pred)
                   for p, r, pred in zip(prompts, recorders, predictions or [()] * len(prompts), strict=True)]
        results = [h.result() for h in handles]
        if check is not None:
            check(eng)
        return results, recorders, eng.metrics()


@pytest.fixture(scope="module")
def plain_greedy(backend):
    return recorded(backend, EngineOptions(max_num_seqs=4), PROMPTS, GREEDY)


def assert_plain_up_to_near_ties(backend, plain_greedy, spec, spec_rows):
    plain, plain_rows, _ = plain_greedy
    rule = NearTieRule()
    for a, b, ra, rb in zip(plain, spec, plain_rows, spec_rows, strict=True):
        for k, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=True)):
            d = rule.compare_row(k, ra.rows[k], rb.rows[k], reference_token=x)
            assert d is None or d.allowed, d.describe(backend.tokenizer.token_text)
            if x != y:
                break  # a near-tie flipped: the contexts differ from here on


def test_greedy_output_is_plain_decodings_up_to_near_ties(backend, plain_greedy):
    spec, spec_rows, snap = recorded(backend, SPEC, PROMPTS, GREEDY)
    assert snap.spec_decode_draft_tokens > snap.spec_decode_accepted_tokens > 16, snap
    assert_plain_up_to_near_ties(backend, plain_greedy, spec, spec_rows)
    assert spec[0].usage.accepted_draft_tokens > 16  # the copy prompt is mostly drafted


def test_a_predicted_output_drafts_without_a_speculative_method(backend, plain_greedy):
    """OpenAI's Predicted Outputs: each answer predicted as plain decoding wrote it, with a few
    tokens edited in the middle; the drafts are verified like prompt lookup's, the output is
    plain decoding's up to near-ties.

    Verifying drafts in a chunk rounds differently from one-token steps, so a near-tie of plain
    decoding may flip (the AVX2 kind flipped the free prompt's 9th token): that answer then
    leaves its prediction, and only its tokens up to the flip can be drafts accepted. An answer
    that stays plain decoding's must have its drafts found again after the edit (more than the
    12 before it accepted), and at least one answer must stay so."""
    plain = plain_greedy[0]
    predictions = [(*r.token_ids[:12], *r.token_ids[:3], *r.token_ids[15:]) for r in plain]
    spec, spec_rows, _ = recorded(backend, EngineOptions(max_num_seqs=4, speculative_adaptive=False),
                                     PROMPTS, GREEDY, predictions=predictions)
    assert_plain_up_to_near_ties(backend, plain_greedy, spec, spec_rows)
    kept = [a.token_ids == b.token_ids for a, b in zip(plain, spec, strict=True)]
    assert any(kept), "every answer flipped a near-tie: nothing shows the drafts found again after the edit"
    k = EngineOptions().num_speculative_tokens
    for same, r, predicted in zip(kept, spec, predictions, strict=True):
        on_prediction = next((i for i, (x, y) in enumerate(zip(r.token_ids, predicted, strict=False))
                              if x != y), len(r.token_ids))
        # The first token comes from the prompt's step, and each verifying step samples one more
        # token of its own after its k drafts: neither is a draft.
        followed = on_prediction - 1
        least = 16 if same else followed - -(-followed // (k + 1)) - 1
        assert r.usage.draft_tokens > r.usage.accepted_draft_tokens > least, (same, on_prediction, r.usage)


def test_own_model_as_draft_keeps_greedy_output_and_frees_its_cells(backend, plain_greedy, model_path):
    """The embedded model drafts for itself: a second llama.cpp context over the same weights,
    with cells of its own that rejected drafts are trimmed from and finished requests free."""
    def check(eng):
        draft = eng._core.speculator.draft
        assert draft.backend is backend  # the same model is not loaded twice
        ex = draft.executor
        held = eng.call(lambda: [ex.seq_len(s) for s in range(ex.max_sequences)])
        assert held == [0] * ex.max_sequences, f"draft cells left per sequence: {held}"
        assert eng.call(lambda: (draft.num_sequences, draft.blocks.num_used_blocks)) == (0, 0)

    options = EngineOptions(max_num_seqs=4, speculative_model=str(model_path), **SELF_DRAFT)
    spec, spec_rows, snap = recorded(backend, options, PROMPTS, GREEDY, check)
    assert snap.kv_usage == 0.0
    assert snap.spec_decode_accepted_tokens >= 0.9 * snap.spec_decode_draft_tokens > 40, snap
    assert_plain_up_to_near_ties(backend, plain_greedy, spec, spec_rows)


def test_constrained_sampled_output_keeps_its_grammar_and_seed(backend):
    # The copied text's capitals and punctuation are drafted and must be refused by the mask.
    spec = GrammarSpec(field="guided_regex", kind="regex", language="regex", source=r"[a-z ]{1,200}")
    params = GenerationParams(max_tokens=24, temperature=0.8, seed=11)
    outputs = []
    for _ in range(2):
        with ServingEngine(backend, SPEC, owns_backend=False) as eng:
            proc = guided_processor(spec, eng.tokenizer)
            handle = eng.submit_sync(eng.encode(COPY_PROMPT), params, logits_processors=[proc])
            outputs.append(handle.result())
            drafted = eng.metrics().spec_decode_draft_tokens
    assert drafted > 0
    assert outputs[0].token_ids == outputs[1].token_ids
    assert re.fullmatch(r"[a-z ]+", outputs[0].text), outputs[0].text
