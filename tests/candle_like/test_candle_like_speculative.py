"""Prompt-lookup speculation on candle_like's paged executor (fp32): greedy output identical.

Drafted positions run as one chunk through the prefill attention path, their rejected tail's
blocks go back to the engine, and the next step overwrites those positions: in fp32 the tokens
must be plain decoding's exactly.
"""

from __future__ import annotations

from ruvllm.testing.speculative import COPY_PROMPT, with_and_without
from ruvllm.types import GenerationParams


def test_greedy_output_is_plain_decodings(backend_fp32):
    params = GenerationParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    plain, spec, snap = with_and_without(backend_fp32, [COPY_PROMPT, "def fibonacci(n):"], params)
    assert [r.token_ids for r in spec] == [r.token_ids for r in plain]
    assert snap.spec_decode_draft_tokens > snap.spec_decode_accepted_tokens > 6, snap
