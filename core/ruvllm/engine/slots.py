"""Executor sequence ids ("slots"), and keeping cached prefixes alive on per-sequence engines.

A paged executor stores KV in the blocks the engine hands out, so a cached block is usable as
long as the block manager keeps it. A per-sequence executor (llama.cpp) stores KV per sequence
id: a cached block is only as good as some sequence that still holds those positions. So with
prefix caching on such an executor, every cached block has an *owner* slot whose KV holds it,
and a slot whose request ended (or was preempted) while owning cached blocks is kept as a
*donor* instead of being freed: a later request that hits those blocks gets the KV copied from
the donor (``copy_prefix``). Once that copy has run, the blocks it covered belong to the new
sequence: it holds the same KV and will be the fresher donor, so a shared system prompt lives
in one donor rather than in every request that used it (each of which, as a donor, would keep
a slot for it and push other prefixes out). Donors are bounded (the executor has a few slots
beyond ``max_num_seqs`` for them) and evicted least recently finished, those that gave their
head away first; a donor left owning nothing is freed, and an evicted donor's blocks pass to a
running sequence that shares them, or leave the prefix cache.

Donor evictions are deferred to :meth:`SlotPool.end_step`, after the forward pass, so a copy
planned in this step always reads a donor that is still there.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict

from ruvllm.engine.block_manager import BlockManager, PrefixHit


class SlotPool:
    """Plain slots: a released slot is forgotten at once (paged layout, or no prefix cache).

    The lowest free slot is handed out first. That keeps the running sequences' ids packed
    together, which llama.cpp needs to run them as one micro-batch: with split KV streams it
    evaluates a batch in runs of consecutive sequence ids, one graph evaluation per run.
    """

    def __init__(self, num_slots: int):
        self._free = list(range(num_slots))  # a heap (sorted is a valid heap)
        self._released: list[int] = []

    def acquire(self) -> int | None:
        return heapq.heappop(self._free) if self._free else None

    def release(self, slot: int) -> None:
        heapq.heappush(self._free, slot)
        self._released.append(slot)

    def take_released(self) -> list[int]:
        """Slots whose KV the executor must forget before anything else uses them."""
        out, self._released = self._released, []
        return out

    def on_cached(self, slot: int, block_ids: list[int]) -> None:
        return None

    def donor_for(self, hit: PrefixHit) -> int | None:
        return None

    def hand_over(self, slot: int, block_ids: list[int]) -> None:
        return None

    def end_step(self) -> None:
        return None

    @property
    def num_donors(self) -> int:
        return 0


class DonorSlotPool(SlotPool):
    def __init__(self, num_slots: int, max_donors: int, blocks: BlockManager):
        super().__init__(num_slots)
        self.max_donors = max_donors
        self.blocks = blocks
        self._owner: dict[int, int] = {}
        self._owned: dict[int, set[int]] = {}
        self._donors: OrderedDict[int, None] = OrderedDict()
        #: Slots that handed their head blocks to another sequence: as donors they go first.
        self._tails: set[int] = set()

    @property
    def num_donors(self) -> int:
        return len(self._donors)

    def release(self, slot: int) -> None:
        self._sync_evictions()
        if self._owned.get(slot):
            self._donors[slot] = None
            self._donors.move_to_end(slot, last=slot not in self._tails)
        else:
            self._owned.pop(slot, None)
            self._tails.discard(slot)
            super().release(slot)

    def on_cached(self, slot: int, block_ids: list[int]) -> None:
        owned = self._owned.setdefault(slot, set())
        for b in block_ids:
            self._owner[b] = slot
            owned.add(b)

    def donor_for(self, hit: PrefixHit) -> int | None:
        """The slot holding every position of ``hit`` (the owner of its last block)."""
        self._sync_evictions()
        if not hit.block_ids:
            return None
        return self._owner.get(hit.block_ids[-1])

    def hand_over(self, slot: int, block_ids: list[int]) -> None:
        """``slot``'s KV now holds ``block_ids`` (copied from their owner): it owns them.

        A sequence that gave blocks away keeps only the tail no request has followed (a
        question after a shared system prompt) and, as a donor (now or once it finishes), goes
        first in the eviction order: otherwise a prompt head used twice in a row evicts another
        head in favour of that tail. A donor left with nothing is freed at :meth:`end_step`;
        one whose whole chain was taken (the next turn of its conversation) always is."""
        self._sync_evictions()
        for b in block_ids:
            old = self._owner.get(b)
            if old is None or old == slot:
                continue
            self._owned[old].discard(b)
            self._owner[b] = slot
            self._owned.setdefault(slot, set()).add(b)
            self._tails.add(old)
            if old in self._donors:
                self._donors.move_to_end(old, last=False)

    def end_step(self) -> None:
        self._sync_evictions()
        for slot in [s for s in self._donors if not self._owned.get(s)]:
            self._free_donor(slot)
        while len(self._donors) > self.max_donors:
            self._evict(next(iter(self._donors)))

    # ------------------------------------------------------------------ internals

    def _sync_evictions(self) -> None:
        """Blocks the block manager reused no longer name a cached prefix: drop ownership."""
        evicted, self.blocks.evicted = self.blocks.evicted, []
        for b in evicted:
            slot = self._owner.pop(b, None)
            if slot is not None:
                self._owned[slot].discard(b)

    def _evict(self, slot: int) -> None:
        for b in list(self._owned.get(slot, ())):
            del self._owner[b]
            heir = next((s for s in self.blocks.holders(b) if s != slot), None)
            if heir is not None:  # a running sequence shares it and holds its KV too
                self._owner[b] = heir
                self._owned.setdefault(heir, set()).add(b)
            else:
                self.blocks.uncache(b)
        self._owned[slot] = set()
        self._free_donor(slot)

    def _free_donor(self, slot: int) -> None:
        del self._donors[slot]
        self._owned.pop(slot, None)
        self._tails.discard(slot)
        SlotPool.release(self, slot)
