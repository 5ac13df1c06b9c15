"""Prompt-lookup and draft-model speculation on candle_like's paged executor (fp32): greedy
output identical.

Drafted positions run as one chunk through the prefill attention path, their rejected tail's
blocks go back to the engine, and the next step overwrites those positions: in fp32 the tokens
must be plain decoding's exactly.
"""

from __future__ import annotations

import json

import attrs
import pytest
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import DraftVocabularyMismatch
from ruvllm.testing.speculative import COPY_PROMPT, FIXED_DRAFTS, SELF_DRAFT, generate
from ruvllm.types import GenerationParams

from .tiny import write_tiny

GREEDY = GenerationParams(max_tokens=16, temperature=0.0, ignore_eos=True)
PROMPTS = [COPY_PROMPT, "def fibonacci(n):"]


@pytest.fixture(scope="module")
def plain(backend_fp32):
    return generate(backend_fp32, PROMPTS, GREEDY, {})[0]


def test_greedy_output_is_plain_decodings(backend_fp32, plain):
    spec, snap = generate(backend_fp32, PROMPTS, GREEDY, FIXED_DRAFTS)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert snap.spec_decode_draft_tokens > snap.spec_decode_accepted_tokens > 6, snap


def test_the_model_as_its_own_draft_gives_plain_decodings_tokens(backend_fp32, embedded_source, plain):
    """The draft runs as a second paged executor over the same weights (its own blocks): fp32
    greedy tokens are plain decoding's exactly, and nearly every draft is kept."""
    options = {**SELF_DRAFT, "speculative_model": str(embedded_source.path)}
    spec, snap = generate(backend_fp32, PROMPTS, GREEDY, options)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert snap.spec_decode_accepted_tokens >= 0.9 * snap.spec_decode_draft_tokens > 0, snap


def test_a_draft_model_of_another_vocabulary_is_refused(backend_fp32, tmp_path):
    gguf, _, _ = write_tiny("llama", tmp_path)
    options = EngineOptions(**SELF_DRAFT, speculative_model=str(gguf))
    with pytest.raises(DraftVocabularyMismatch) as caught:
        ServingEngine(backend_fp32, options, owns_backend=False)
    message = str(caught.value)
    assert "tiny-llama" in message and backend_fp32.info.name in message, message
    assert "49152 tokens" in message, message


def test_a_draft_on_another_backend_shares_the_vocabulary(backend_fp32, embedded_source, plain):
    """The same GGUF drafted by llama.cpp for candle_like, loaded through the registry: the two
    backends' tokenizers agree token for token (their BOS/EOS conventions differ, which must not
    refuse it), the tokens are plain decoding's, and the draft's blocks are freed."""
    pytest.importorskip("ruvllm_llamacpp", reason="the llamacpp plugin is not installed")
    options = {**SELF_DRAFT, "speculative_model": str(embedded_source.path),
               "speculative_draft_backend": "llamacpp"}
    spec, snap = generate(backend_fp32, PROMPTS, GREEDY, options)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert snap.spec_decode_accepted_tokens >= 0.8 * snap.spec_decode_draft_tokens > 0, snap


def _guided(backend, options: dict, params: GenerationParams, seeds: tuple[int, ...]) -> tuple[list, object]:
    from ruvllm.guided import guided_processor, json_schema_grammar

    schema = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 160}},
              "required": ["text"], "additionalProperties": False}
    spec = json_schema_grammar("guided_json", schema)
    with ServingEngine(backend, EngineOptions(max_num_seqs=4, **options), owns_backend=False) as eng:
        ids = eng.encode(f'{COPY_PROMPT.split("Repeated:")[0]}As JSON: {{"text": "The river bends')
        handles = [eng.submit_sync(ids, attrs.evolve(params, seed=seed),
                                   logits_processors=[guided_processor(spec, eng.tokenizer)])
                   for seed in seeds]
        results = [h.result() for h in handles]
        return results, eng.metrics()


# Sampled: one request, as plain decoding's batch of two rows rounds its logits otherwise than a
# batch of one (2e-5 here), which moves a sampled token now and then whether or not drafts run.
@pytest.mark.parametrize(("params", "seeds"), [(GenerationParams(max_tokens=24, temperature=0.0), (1, 2)),
                                               (GenerationParams(max_tokens=24, temperature=0.8), (1,))],
                         ids=["greedy", "sampled"])
def test_structured_output_is_what_it_is_without_speculation(backend_fp32, params, seeds):
    """A JSON-schema grammar with drafts verified: a drafted token the grammar forbids is never
    kept and a rejected draft does not advance the grammar, so the output (greedy, and sampled
    with a seed) is plain decoding's exactly, and valid JSON of the schema when it ends."""
    plain, _ = _guided(backend_fp32, {}, params, seeds)
    spec, snap = _guided(backend_fp32, FIXED_DRAFTS, params, seeds)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert snap.spec_decode_draft_tokens > snap.spec_decode_accepted_tokens > 0, snap
    for r in spec:
        if r.finish_reason.value == "stop":
            assert set(json.loads(r.text)) == {"text"}, r.text
