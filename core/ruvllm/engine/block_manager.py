"""KV capacity in fixed-size blocks: block tables, reference counts and the prefix cache.

The engine, not the executor, decides where every token's KV lives. A sequence owns a *block
table*: block ``i`` of the table holds positions ``[i*block_size, (i+1)*block_size)``. Blocks are
reference counted so that a forked sequence or a cached prompt prefix can share them.

Prefix caching follows vLLM: every *full* block gets a hash chained from its parent's hash, its
tokens and the request's cache salt, so a hash names a whole prefix, not just a block, and two
tenants with different salts never share KV. A block whose last reference goes away but which
holds a hashed prefix is not forgotten: it becomes *evictable* and stays findable until an
allocation needs it, in least-recently-freed order.

Everything is pure bookkeeping (no model calls), so the accounting can be checked exhaustively:
:meth:`BlockManager.check_invariants` is what the property-based tests call after every step.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence

import attrs

from ruvllm.errors import InvalidRequest


@attrs.define
class _Block:
    block_id: int
    ref_count: int = 0
    #: Chained hash of the prefix ending with this block, once the block is full and cached.
    block_hash: bytes | None = None


@attrs.define
class _SeqBlocks:
    table: list[int] = attrs.field(factory=list)
    #: Positions whose KV slots have been allocated (and, once the step ran, written).
    num_tokens: int = 0
    #: Hashes of the leading full blocks already registered (chain state for the next one).
    hashes: list[bytes] = attrs.field(factory=list)


@attrs.frozen
class PrefixHit:
    """Cached blocks that hold a prompt's leading tokens, and how many tokens the hit serves:
    the blocks' own, or more that a donor sequence holds past them
    (:meth:`ruvllm.engine.slots.SlotPool.donor_for`), which the new sequence's own blocks
    account for."""

    block_ids: tuple[int, ...]
    num_tokens: int


NO_HIT = PrefixHit((), 0)


def block_hash(parent: bytes | None, tokens: Sequence[int], salt: str | None) -> bytes:
    """Hash of a full block chained from its parent: equal hashes mean equal whole prefixes.

    SHA-256 rather than Python's ``hash`` so a collision cannot silently hand one request
    another's KV.
    """
    h = hashlib.sha256()
    h.update(parent or b"\x00root")
    h.update(b"|".join(str(t).encode() for t in tokens))
    if salt:
        h.update(b"\x00salt:" + salt.encode())
    return h.digest()


class BlockManager:
    """Allocates KV blocks to sequences; never leaks or double-frees one.

    ``watermark`` is a fraction of all blocks kept free when admitting a *new* sequence, so the
    sequences already running can keep decoding without immediately preempting each other.
    """

    def __init__(self, num_blocks: int, block_size: int, *, enable_prefix_caching: bool = True,
                 watermark: float = 0.01):
        if num_blocks < 1:
            raise InvalidRequest("num_blocks", f"must be >= 1, got {num_blocks}", num_blocks)
        if block_size < 1:
            raise InvalidRequest("block_size", f"must be >= 1, got {block_size}", block_size)
        if not 0.0 <= watermark < 1.0:
            raise InvalidRequest("watermark", f"must be in [0, 1), got {watermark}", watermark)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.watermark_blocks = int(watermark * num_blocks)
        self._blocks = [_Block(i) for i in range(num_blocks)]
        # Unreferenced blocks holding nothing worth keeping: reused first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        # Unreferenced blocks holding a cached prefix, least recently freed first.
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._cached: dict[bytes, int] = {}
        self._seqs: dict[int, _SeqBlocks] = {}
        #: Blocks whose cached contents were dropped to make room (for callers that keep
        #: per-block side data, such as the per-sequence executor's KV donors).
        self.evicted: list[int] = []

    # ------------------------------------------------------------------ queries

    @property
    def num_free_blocks(self) -> int:
        """Blocks an allocation can take now (free plus evictable cached blocks)."""
        return len(self._free) + len(self._evictable)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    @property
    def num_resident_blocks(self) -> int:
        """Blocks whose KV is kept: held by a sequence, or cached for a later hit (the most a
        per-sequence executor's memory may hold, in blocks)."""
        return self.num_blocks - len(self._free)

    @property
    def num_cached_blocks(self) -> int:
        return len(self._cached)

    def has_seq(self, seq_id: int) -> bool:
        return seq_id in self._seqs

    def block_table(self, seq_id: int) -> tuple[int, ...]:
        return tuple(self._seqs[seq_id].table)

    def num_tokens(self, seq_id: int) -> int:
        return self._seqs[seq_id].num_tokens

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def ref_count(self, block_id: int) -> int:
        return self._blocks[block_id].ref_count

    def is_cached(self, block_id: int) -> bool:
        return self._blocks[block_id].block_hash is not None

    # ------------------------------------------------------------------ prefix cache

    def lookup_prefix(self, token_ids: Sequence[int], cache_salt: str | None = None) -> PrefixHit:
        """Longest run of cached full blocks at the start of ``token_ids``.

        At most ``len(token_ids) - 1`` tokens are reported: the last prompt token must always be
        run, because its logits give the first generated token.
        """
        if not self.enable_prefix_caching:
            return NO_HIT
        bs = self.block_size
        usable = (len(token_ids) - 1) // bs
        parent: bytes | None = None
        found: list[int] = []
        for i in range(usable):
            h = block_hash(parent, token_ids[i * bs:(i + 1) * bs], cache_salt)
            block = self._cached.get(h)
            if block is None:
                break
            found.append(block)
            parent = h
        return PrefixHit(tuple(found), len(found) * bs)

    def cache_blocks(self, seq_id: int, token_ids: Sequence[int], num_computed: int,
                     cache_salt: str | None = None) -> list[int]:
        """Register the full blocks among the first ``num_computed`` tokens of ``seq_id``;
        return the blocks newly entered in the cache.

        Call after the step that wrote them. A block whose prefix is already cached in another
        block stays private (its twin remains the one found by lookups).
        """
        added: list[int] = []
        if not self.enable_prefix_caching:
            return added
        seq = self._seqs[seq_id]
        bs = self.block_size
        full = min(num_computed, seq.num_tokens, len(token_ids)) // bs
        while len(seq.hashes) < full:
            i = len(seq.hashes)
            parent = seq.hashes[-1] if seq.hashes else None
            h = block_hash(parent, token_ids[i * bs:(i + 1) * bs], cache_salt)
            block = self._blocks[seq.table[i]]
            if h not in self._cached and block.block_hash is None:
                self._cached[h] = block.block_id
                block.block_hash = h
                added.append(block.block_id)
            seq.hashes.append(h)
        return added

    def uncache(self, block_id: int) -> None:
        """Take one block out of the prefix cache (its KV is no longer reachable)."""
        block = self._blocks[block_id]
        if block.block_hash is None:
            return
        del self._cached[block.block_hash]
        block.block_hash = None
        if block_id in self._evictable:
            del self._evictable[block_id]
            self._free.append(block_id)

    def holders(self, block_id: int) -> list[int]:
        """Sequences whose block table holds ``block_id``."""
        return [sid for sid, seq in self._seqs.items() if block_id in seq.table]

    # ------------------------------------------------------------------ allocation

    def can_admit(self, num_tokens: int, hit: PrefixHit = NO_HIT) -> bool:
        """Whether a new sequence of ``num_tokens`` fits while keeping the watermark free."""
        need = self.blocks_needed(num_tokens) - len(hit.block_ids)
        # Hit blocks that are evictable stop counting as free once we take them.
        taken = sum(1 for b in hit.block_ids if self._blocks[b].ref_count == 0)
        return self.num_free_blocks - taken - need >= self.watermark_blocks

    def allocate(self, seq_id: int, num_tokens: int, hit: PrefixHit = NO_HIT
                 ) -> list[tuple[int, int]] | None:
        """Create ``seq_id`` with slots for ``num_tokens`` positions, sharing ``hit``'s blocks.

        Returns copy-on-write pairs (always empty for a new sequence) or None, changing
        nothing, when the blocks are not there.
        """
        if seq_id in self._seqs:
            raise ValueError(f"sequence {seq_id} already has blocks")
        if hit.num_tokens > num_tokens:
            raise ValueError("prefix hit longer than the sequence")
        whole = len(hit.block_ids) * self.block_size
        if hit.num_tokens < whole:
            raise ValueError(f"a hit on {len(hit.block_ids)} blocks serves at least {whole} tokens, "
                             f"not {hit.num_tokens}")
        taken = sum(1 for b in hit.block_ids if self._blocks[b].ref_count == 0)
        if self.blocks_needed(num_tokens) - len(hit.block_ids) > self.num_free_blocks - taken:
            return None
        seq = _SeqBlocks()
        for b in hit.block_ids:
            self._ref(b)
            seq.table.append(b)
            seq.hashes.append(self._blocks[b].block_hash)  # type: ignore[arg-type]
        seq.num_tokens = whole  # positions past the blocks go in the sequence's own blocks
        self._seqs[seq_id] = seq
        pairs = self.extend(seq_id, num_tokens)
        assert pairs is not None  # capacity was checked above
        return pairs

    def extend(self, seq_id: int, num_tokens: int) -> list[tuple[int, int]] | None:
        """Grow ``seq_id`` to slots for ``num_tokens`` positions.

        A partially filled last block that other sequences share is copied first (the returned
        ``(src, dst)`` pairs are for :meth:`BatchExecutor.copy_blocks`), so writing new tokens
        never changes a neighbour's KV. Returns None, changing nothing, when blocks run out.
        """
        seq = self._seqs[seq_id]
        if num_tokens <= seq.num_tokens:
            return []
        bs = self.block_size
        cow = seq.num_tokens % bs != 0 and self._blocks[seq.table[seq.num_tokens // bs]].ref_count > 1
        new_blocks = self.blocks_needed(num_tokens) - len(seq.table)
        if new_blocks + int(cow) > self.num_free_blocks:
            return None
        pairs: list[tuple[int, int]] = []
        if cow:
            idx = seq.num_tokens // bs
            old = seq.table[idx]
            new = self._take()
            self._unref(old)
            seq.table[idx] = new
            pairs.append((old, new))
        for _ in range(new_blocks):
            seq.table.append(self._take())
        seq.num_tokens = num_tokens
        return pairs

    def truncate(self, seq_id: int, num_tokens: int) -> None:
        """Shrink ``seq_id`` to slots for its first ``num_tokens`` positions: the blocks past
        them go back (speculative decoding's rejected drafts)."""
        seq = self._seqs[seq_id]
        if num_tokens >= seq.num_tokens:
            return
        keep = self.blocks_needed(num_tokens)
        for b in reversed(seq.table[keep:]):
            self._unref(b)
        del seq.table[keep:]
        del seq.hashes[num_tokens // self.block_size:]
        seq.num_tokens = num_tokens

    def fork(self, src_seq_id: int, dst_seq_id: int) -> None:
        """Give ``dst`` the same blocks as ``src`` (shared, copy-on-write when extended)."""
        if dst_seq_id in self._seqs:
            raise ValueError(f"sequence {dst_seq_id} already has blocks")
        src = self._seqs[src_seq_id]
        for b in src.table:
            self._ref(b)
        self._seqs[dst_seq_id] = _SeqBlocks(list(src.table), src.num_tokens, list(src.hashes))

    def free(self, seq_id: int) -> None:
        """Return ``seq_id``'s blocks; cached ones stay findable until evicted.

        Freeing an unknown sequence is a no-op, so completion, cancellation, errors and
        preemption can all call it without tracking who freed first.
        """
        seq = self._seqs.pop(seq_id, None)
        if seq is None:
            return
        # Last block first: when memory runs short the tail of a prefix goes before its head.
        for b in reversed(seq.table):
            self._unref(b)

    # ------------------------------------------------------------------ internals

    def _ref(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count == 0:
            self._evictable.pop(block_id, None)
        block.ref_count += 1

    def _unref(self, block_id: int) -> None:
        block = self._blocks[block_id]
        if block.ref_count <= 0:
            raise AssertionError(f"block {block_id} freed twice")
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.block_hash is not None:
                self._evictable[block_id] = None
                self._evictable.move_to_end(block_id)
            else:
                self._free.append(block_id)

    def _take(self) -> int:
        if self._free:
            block_id = self._free.pop()
        else:
            block_id, _ = self._evictable.popitem(last=False)
            block = self._blocks[block_id]
            assert block.block_hash is not None
            del self._cached[block.block_hash]
            block.block_hash = None
            self.evicted.append(block_id)
        self._blocks[block_id].ref_count = 1
        return block_id

    def check_invariants(self) -> None:
        """Raise AssertionError when the accounting is inconsistent (for tests)."""
        refs = [0] * self.num_blocks
        for seq in self._seqs.values():
            assert len(seq.table) == self.blocks_needed(seq.num_tokens), "table/length mismatch"
            for b in seq.table:
                refs[b] += 1
        free = set(self._free)
        assert len(free) == len(self._free), "a block is on the free list twice"
        assert not free & set(self._evictable), "a block is both free and evictable"
        for block in self._blocks:
            assert block.ref_count == refs[block.block_id], (
                f"block {block.block_id}: ref_count {block.ref_count} != {refs[block.block_id]} uses"
            )
            unreferenced = block.block_id in free or block.block_id in self._evictable
            assert unreferenced == (block.ref_count == 0), f"block {block.block_id} lost or leaked"
            if block.block_id in self._evictable:
                assert block.block_hash is not None
            if block.block_hash is not None:
                assert self._cached.get(block.block_hash) == block.block_id
        assert len(self._cached) == sum(1 for b in self._blocks if b.block_hash is not None)
