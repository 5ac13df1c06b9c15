"""The llama.cpp executor's batch-invariant mode (ruvllm_llamacpp.cell_order): a row's logits are
the same bits whatever else shares its step or the pool, and the default executor is not.

Each case computes one sequence's rows on a fresh executor, then again where the default
executor moves them: prefilled in chunks beside other sequences, decoded beside others after a
finished request left a hole below (llama.cpp then takes the lowest free cell), over more than
512 cells alone (llama.cpp's split-KV kernel), and from a prefix shared with another sequence.
Exact equality; the default executor failing the same comparison shows it can fail.
"""

from __future__ import annotations

import numpy as np
import pytest
from ruvllm.errors import BatchInvariantUnsupported
from ruvllm.executor import BatchEntry
from ruvllm.testing.speculative import COPY_PROMPT, tokens_and_logprobs, with_and_without
from ruvllm.types import GenerationParams
from ruvllm_llamacpp.cell_order import INVARIANT_UBATCH, needs_pad

TEXT = ("The river bends twice before it reaches the old stone bridge near the market. "
        "Engineers measured the load on each beam and wrote the numbers down. In winter the village "
        "library opens late, and children read by the warm stove. A careful cook tastes the soup. ") * 16
#: Past 512 cells: a lone decode row there would take the split-KV kernel.
LONG = 560


def entry(seq: int, tokens: list[int], start: int, sample: bool = True) -> BatchEntry:
    return BatchEntry(seq_id=seq, tokens=tokens, start_pos=start, sample=sample, block_table=[])


@pytest.fixture(scope="module")
def backend(llm):
    return llm.backend


@pytest.fixture(scope="module")
def toks(backend) -> list[int]:
    tokens = backend.tokenizer.encode(TEXT)
    assert len(tokens) > LONG + 8
    return tokens


def alone(ex, toks: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The prompt's last row and four decode rows of sequence 0, nothing else in the pool."""
    ex.execute([entry(0, toks[:300], 0, False)])
    last = ex.execute([entry(0, toks[300:LONG], 300)])[0]
    decoded = [ex.execute([entry(0, [toks[LONG + i]], LONG + i)])[0] for i in range(4)]
    ex.free(0)
    return last, decoded


def crowded(ex, toks: list[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The same rows among other sequences: sequence 0 prefilled in chunks beside 2, a hole left
    below it by 1, then decoded beside 2."""
    ex.execute([entry(1, toks[:150], 0, False)])
    ex.execute([entry(2, toks[5:40], 0, False), entry(0, toks[:100], 0, False)])
    ex.execute([entry(0, toks[100:300], 100, False), entry(2, [toks[40]], 35, False)])
    last = ex.execute([entry(0, toks[300:LONG], 300), entry(2, [toks[41]], 36, False)])[0]
    ex.free(1)
    decoded = [ex.execute([entry(2, [toks[42 + i]], 37 + i), entry(0, [toks[LONG + i]], LONG + i)])[1]
               for i in range(4)]
    return last, decoded


def test_rows_are_the_same_bits_alone_and_crowded_in_the_mode(backend, toks) -> None:
    ex = backend.create_executor(max_sequences=8, block_size=16, batch_invariant=True)
    try:
        ref_last, ref_decoded = alone(ex, toks)
        last, decoded = crowded(ex, toks)
        assert ex.cell_order.compactions >= 1  # the hole was closed, not avoided by luck
        # A hit on sequence 0's prefix, shared by sequence 3, after 2 left: the same last row.
        ex.copy_prefix(0, 3, 288)
        ex.free(2)
        hit = ex.execute([entry(3, toks[288:LONG], 288)])[0]
    finally:
        ex.close()
    assert np.array_equal(ref_last, last)
    assert all(np.array_equal(a, b) for a, b in zip(ref_decoded, decoded, strict=True))
    assert np.array_equal(ref_last, hit)


def test_the_default_executor_moves_the_same_rows(backend, toks) -> None:
    """Without the mode the comparison above fails: the case is one that moves logits."""
    ex = backend.create_executor(max_sequences=8, block_size=16)
    try:
        ref_last, ref_decoded = alone(ex, toks)
        last, decoded = crowded(ex, toks)
    finally:
        ex.close()
    same = [np.array_equal(ref_last, last)] + [np.array_equal(a, b)
                                               for a, b in zip(ref_decoded, decoded, strict=True)]
    assert not all(same), "the default executor gave every row the same bits: the case proves nothing"


def test_a_one_row_micro_batch_is_padded() -> None:
    assert [n for n in range(1, 200) if needs_pad(n)] == [1, 1 + INVARIANT_UBATCH, 1 + 2 * INVARIANT_UBATCH,
                                                          1 + 3 * INVARIANT_UBATCH]
    assert INVARIANT_UBATCH < 64  # flash attention's tiled kernel starts at 64 rows


def test_the_mode_refuses_flash_attention_off(test_options) -> None:
    from ruvllm import LLM

    with LLM(backend="llamacpp", options={**test_options, "flash_attn": False}) as off, \
            pytest.raises(BatchInvariantUnsupported, match="flash attention"):
        off.backend.create_executor(max_sequences=4, block_size=16, batch_invariant=True)


def test_speculative_drafts_change_no_bit_in_the_mode(backend) -> None:
    """Drafted positions are verified as rows of one step (under 63, so on the per-row kernel):
    in the mode tokens and logprobs equal plain decoding's exactly; by default the same
    comparison fails on logprobs."""
    params = GenerationParams(max_tokens=16, temperature=0.0, ignore_eos=True, logprobs=2)
    prompts = [COPY_PROMPT, "def fibonacci(n):"]
    plain, drafted, snap = with_and_without(backend, prompts, params, options={"batch_invariant": True})
    assert snap.spec_decode_accepted_tokens > 4, snap
    assert tokens_and_logprobs(drafted) == tokens_and_logprobs(plain)
    plain, drafted, _ = with_and_without(backend, prompts, params)
    assert tokens_and_logprobs(drafted) != tokens_and_logprobs(plain)
