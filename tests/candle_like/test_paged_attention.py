"""The native pool attention (ruvllm_candle_like.paged_attention): the PyTorch path's result
from the pool in place, each row's bits independent of the batch, a chunk's rows those of
decoding them, and the executor's rows on it where it runs (elsewhere these tests skip with the
reason the executor describes)."""

from __future__ import annotations

import pytest
import torch
from ruvllm_candle_like import paged_attention
from ruvllm_candle_like.attention_ops import attend_decode_batch
from ruvllm_candle_like.paged_attention import PoolRows

SLOTS, KV_HEADS, DIM, HEADS = 4096, 3, 64, 9
POOL = torch.randn(SLOTS, 2, KV_HEADS, DIM, generator=torch.Generator().manual_seed(0)).half()

pytestmark = pytest.mark.skipif(paged_attention.unavailable(POOL, DIM) is not None,
                                reason=str(paged_attention.unavailable(POOL, DIM)))


def _batch(lengths: list[int], seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    longest = max(lengths)
    # Block-scattered slots, as block tables give them, padded with slot 0 past each length.
    gather = torch.zeros(len(lengths), longest, dtype=torch.int64)
    for b, n in enumerate(lengths):
        gather[b, :n] = torch.randperm(SLOTS, generator=gen)[:n]
    return torch.randn(len(lengths), HEADS, DIM, generator=gen), gather, torch.tensor(lengths)


def _decode(q: torch.Tensor, gather: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Row b over the first lengths[b] slots of gather[b], through the executor's row plan."""
    rows = PoolRows.of_entries([g[:int(n)].numpy() for g, n in zip(gather, lengths, strict=True)],
                               [int(n) - 1 for n in lengths], [1] * len(lengths), [True] * len(lengths))
    return paged_attention.attend(q, POOL, rows)


def _reference(q: torch.Tensor, gather: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    b, longest = gather.shape
    keys, values = POOL.index_select(0, gather.reshape(-1)).double().unbind(1)
    keys = keys.view(b, longest, KV_HEADS, DIM).transpose(1, 2)
    values = values.view(b, longest, KV_HEADS, DIM).transpose(1, 2)
    valid = torch.arange(longest)[None, :] < lengths[:, None]
    return attend_decode_batch(q.double(), keys, values, valid)


# 2,500 and 1,025 positions: pairs past the kernel's SEGMENT (1,024), split and merged.
@pytest.mark.parametrize("lengths", [[1], [7, 130, 2], [600] * 3 + [5], [2500, 3, 1025]])
def test_matches_the_pytorch_path_in_float64_to_float32_rounding(lengths):
    q, gather, n = _batch(lengths, seed=len(lengths))
    got = _decode(q, gather, n)
    assert got.shape == (len(lengths), HEADS * DIM) and got.dtype == torch.float32
    # Outputs are convex sums of fp16 values (|v| < 5 here): float32 keeps ~1e-6 of that.
    assert torch.allclose(got.double(), _reference(q, gather, n), rtol=0, atol=2e-5)


def test_a_sequence_has_the_same_bits_alone_and_in_any_batch():
    q, gather, n = _batch([40, 300, 9, 128, 2100], seed=5)
    batched = _decode(q, gather, n)
    for b in range(5):
        alone = _decode(q[b:b + 1], gather[b:b + 1, :int(n[b])], n[b:b + 1])
        assert torch.equal(alone[0], batched[b]), b


def test_pools_it_cannot_read_are_named():
    assert "float16" in str(paged_attention.unavailable(POOL.float(), DIM))
    assert "multiple of 8" in str(paged_attention.unavailable(POOL, 60))


def test_the_executor_decodes_through_it(embedded_source):
    from ruvllm_candle_like.backend import CandleLikeBackend

    backend = CandleLikeBackend.load(embedded_source, {"dtype": "float32"})
    try:
        executor = backend.create_executor(max_sequences=2, block_size=16)
        assert executor.native_decode_off is None
        assert "native decode attention" in executor.describe()
    finally:
        backend.close()


def test_a_chunks_rows_are_each_rows_decode():
    """A drafted token verified in a chunk gets the bits of decoding it: each row over its own
    causal prefix of the sequence's slots. A chunk the executor gives SDPA is left alone."""
    _, gather, _ = _batch([40], seed=9)
    rows = torch.randn(6, HEADS, DIM, generator=torch.Generator().manual_seed(10))
    plan = PoolRows.of_entries([gather[0].numpy()], [34], [6], [True])
    assert plan.lengths.tolist() == [35, 36, 37, 38, 39, 40]
    chunk = paged_attention.attend(rows, POOL, plan)
    for i in range(6):
        alone = _decode(rows[i:i + 1], gather[:, :35 + i], torch.tensor([35 + i]))
        assert torch.equal(chunk[i], alone[0]), i
    assert PoolRows.of_entries([gather[0].numpy()], [34], [6], [False]).lengths.eq(0).all()


def test_the_pool_is_resident_only_as_it_fills():
    """An anonymous mapping: the OS maps its pages zero-filled on first write, so an idle server's
    pool costs no memory yet keeps its capacity (zeroed_pool, docs/architecture.md)."""
    from ruvllm_candle_like.executor import zeroed_pool

    def rss_kb() -> int:
        return int(open("/proc/self/status").read().split("VmRSS:")[1].split()[0])

    before = rss_kb()
    pool = zeroed_pool((65536, 2, 3, 64), torch.float16, torch.device("cpu"))  # 48 MiB
    assert rss_kb() - before < 8 * 1024
    pool[:32768].fill_(1)  # half of it written: 24 MiB
    assert 20 * 1024 < rss_kb() - before < 32 * 1024
    assert pool[32768:].eq(0).all() and pool[:32768].eq(1).all()


def test_rows_past_the_slots_given_are_refused():
    """The kernel checks every row against the slots given, so it never reads past them."""
    q, gather, _ = _batch([7, 9], seed=11)
    slots = gather.reshape(-1)
    for starts, lengths in (([0, 9], [7, 10]), ([0, 10], [7, 9]), ([0, -1], [7, 9])):
        bad = PoolRows(slots, torch.tensor(starts), torch.tensor(lengths))
        with pytest.raises(ValueError, match="run past the 18 slots"):
            paged_attention.attend(q, POOL, bad)
