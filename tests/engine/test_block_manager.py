"""Block manager: refcounts, prefix cache, copy-on-write, eviction, and no leak under any mix."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ruvllm.engine.block_manager import BlockManager
from ruvllm.errors import InvalidRequest


def test_allocate_extend_free_returns_every_block():
    bm = BlockManager(8, 4, watermark=0.0)
    assert bm.allocate(1, 5) == []
    assert len(bm.block_table(1)) == 2
    assert bm.num_free_blocks == 6
    assert bm.extend(1, 9) == []
    assert len(bm.block_table(1)) == 3
    bm.free(1)
    bm.free(1)  # idempotent: completion and cancellation may both free
    assert bm.num_free_blocks == 8
    bm.check_invariants()


def test_allocation_fails_without_changing_state():
    bm = BlockManager(4, 4, watermark=0.0)
    assert bm.allocate(1, 12) == []
    assert bm.allocate(2, 8) is None
    assert not bm.has_seq(2)
    assert bm.extend(1, 20) is None
    assert bm.num_tokens(1) == 12
    bm.check_invariants()


def test_prefix_hit_shares_blocks_and_never_covers_the_last_token():
    bm = BlockManager(16, 4, watermark=0.0)
    prompt = list(range(10))  # 2 full blocks + 2 tokens
    bm.allocate(1, len(prompt))
    bm.cache_blocks(1, prompt, len(prompt))
    hit = bm.lookup_prefix(prompt)
    assert hit.num_tokens == 8 and hit.block_ids == bm.block_table(1)[:2]
    # An exact 8-token prompt may only reuse 1 block: its last token must run for logits.
    assert bm.lookup_prefix(prompt[:8]).num_tokens == 4
    bm.allocate(2, 10, hit)
    assert bm.block_table(2)[:2] == bm.block_table(1)[:2]
    assert bm.ref_count(bm.block_table(1)[0]) == 2
    bm.free(1)
    bm.free(2)
    bm.check_invariants()
    assert bm.num_free_blocks == 16


def test_cache_salt_isolates_tenants():
    bm = BlockManager(16, 4, watermark=0.0)
    prompt = list(range(9))
    bm.allocate(1, 9)
    bm.cache_blocks(1, prompt, 9, cache_salt="tenant-a")
    assert bm.lookup_prefix(prompt, "tenant-a").num_tokens == 8
    assert bm.lookup_prefix(prompt, "tenant-b").num_tokens == 0
    assert bm.lookup_prefix(prompt).num_tokens == 0


def test_chained_hash_names_the_whole_prefix():
    bm = BlockManager(16, 4, watermark=0.0)
    a = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    bm.allocate(1, 9)
    bm.cache_blocks(1, a, 9)
    b = [0, 2, 3, 4, 5, 6, 7, 8, 9]  # same second block, different first block
    assert bm.lookup_prefix(b).num_tokens == 0


def test_freed_cached_blocks_stay_findable_until_evicted_lru():
    bm = BlockManager(4, 2, watermark=0.0)
    p1, p2 = [1, 1, 1], [2, 2, 2]
    for sid, p in ((1, p1), (2, p2)):
        bm.allocate(sid, 3)
        bm.cache_blocks(sid, p, 3)
        bm.free(sid)
    assert bm.num_free_blocks == 4 and bm.num_cached_blocks == 2
    assert bm.lookup_prefix(p1).num_tokens == 2
    # Three fresh blocks: the two uncached go first, then the least recently freed cached one.
    bm.allocate(3, 6)
    assert bm.lookup_prefix(p1).num_tokens == 0
    assert bm.lookup_prefix(p2).num_tokens == 2
    bm.check_invariants()


def test_hit_on_evictable_block_counts_against_free_space():
    bm = BlockManager(3, 2, watermark=0.0)
    p = [5, 5, 5]
    bm.allocate(1, 3)
    bm.cache_blocks(1, p, 3)
    bm.free(1)
    hit = bm.lookup_prefix(p)
    assert bm.can_admit(6, hit)  # 1 reused + 2 new = 3 blocks
    assert not bm.can_admit(8, hit)
    assert bm.allocate(2, 6, hit) == []
    bm.check_invariants()


def test_fork_then_extend_copies_the_shared_partial_block():
    bm = BlockManager(8, 4, watermark=0.0)
    bm.allocate(1, 6)  # blocks: full, partial (2 of 4)
    bm.fork(1, 2)
    shared = bm.block_table(1)[1]
    pairs = bm.extend(2, 7)
    assert len(pairs) == 1 and pairs[0][0] == shared
    assert bm.block_table(2)[1] == pairs[0][1] != shared
    assert bm.block_table(2)[0] == bm.block_table(1)[0]
    assert bm.extend(1, 7) == []  # now sole owner: no copy
    bm.free(1)
    bm.free(2)
    bm.check_invariants()
    assert bm.num_free_blocks == 8


def test_watermark_keeps_room_for_running_sequences():
    bm = BlockManager(10, 4, watermark=0.2)
    assert bm.can_admit(32)
    assert not bm.can_admit(33)


def test_bad_sizes_name_the_field():
    with pytest.raises(InvalidRequest, match="block_size"):
        BlockManager(4, 0)
    with pytest.raises(InvalidRequest, match="watermark"):
        BlockManager(4, 4, watermark=1.5)


# ---------------------------------------------------------------------- property-based

OPS = st.lists(
    st.tuples(
        st.sampled_from(["allocate", "extend", "fork", "free", "preempt", "cache"]),
        st.integers(0, 5),  # sequence id
        st.integers(0, 5),  # second id / amount
        st.integers(1, 14),  # length
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, num_blocks=st.integers(1, 12), block_size=st.integers(1, 4), prefix=st.booleans())
def test_random_operations_never_leak_or_double_free(ops, num_blocks, block_size, prefix):
    bm = BlockManager(num_blocks, block_size, enable_prefix_caching=prefix, watermark=0.0)
    tokens: dict[int, list[int]] = {}
    for op, sid, other, length in ops:
        if op == "allocate" and not bm.has_seq(sid):
            toks = [(sid * 7 + i) % 3 for i in range(length)]  # few distinct prompts: many hits
            hit = bm.lookup_prefix(toks)
            if bm.allocate(sid, length, hit) is not None:
                tokens[sid] = toks
        elif op == "extend" and bm.has_seq(sid):
            new = bm.num_tokens(sid) + other
            if bm.extend(sid, new) is not None:
                tokens[sid] = tokens[sid] + [other % 3] * (new - len(tokens[sid]))
        elif op == "fork" and bm.has_seq(sid) and not bm.has_seq(other):
            bm.fork(sid, other)
            tokens[other] = list(tokens[sid])
        elif op in ("free", "preempt"):
            bm.free(sid)  # preemption by recompute frees exactly like completion
            tokens.pop(sid, None)
        elif op == "cache" and bm.has_seq(sid):
            bm.cache_blocks(sid, tokens[sid], bm.num_tokens(sid))
        bm.check_invariants()
    for sid in list(tokens):
        bm.free(sid)
    bm.check_invariants()
    assert bm.num_free_blocks == num_blocks
    assert bm.num_used_blocks == 0
