"""Prompt-lookup speculation on the MLX executor (per-sequence KV): rejected drafts are cut
from the sequence's cache (``trim``) and greedy output is plain decoding's."""

from __future__ import annotations

from ruvllm.testing.speculative import COPY_PROMPT, with_and_without
from ruvllm.types import GenerationParams


def test_greedy_output_is_plain_decodings(backend):
    params = GenerationParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    plain, spec, snap = with_and_without(backend, [COPY_PROMPT], params, max_num_seqs=2)
    assert spec[0].token_ids == plain[0].token_ids
    assert snap.spec_decode_draft_tokens > snap.spec_decode_accepted_tokens > 4, snap
