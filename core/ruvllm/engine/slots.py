"""Executor sequence ids ("slots"), and keeping cached prefixes alive on per-sequence engines.

A paged executor stores KV in the blocks the engine hands out, so a cached block is usable as
long as the block manager keeps it. A per-sequence executor (llama.cpp, MLX) stores KV per
sequence id: a cached block is only as good as some sequence that still holds those positions.
So with prefix caching on such an executor, a slot whose request ended (or was preempted) while
its KV held cached blocks is kept as a *donor*: trimmed to the leading run of blocks the block
manager caches (its *chain*), it serves later requests that hit them (``copy_prefix``; on
llama.cpp's unified pool that adds the new sequence to the same cells, so a prefix shared by N
requests occupies its cells once, as its blocks are counted once).

The executor's KV must never hold more than the block manager accounts for, or the pool would
run out of cells the engine believes free. Three rules keep them equal:

- a released slot keeps only its chain (its partial last block and any block not cached are
  trimmed away at once, before the next forward pass);
- when the block manager reuses a cached block for something else, every donor holding it is
  trimmed to just before it (blocks after it in a chain are unreachable without it), and a
  cached block left with no holder at all leaves the prefix cache;
- donors are bounded (``max_donors``, sequence ids beyond ``max_num_seqs``): one whose chain
  other sequences hold as well goes at once; past the bound, the one holding the fewest blocks
  nobody else holds goes first, the least recently used among equals.

Hits end on a token, not only on a block: a donor remembers the tokens of the positions it keeps,
and a prompt that goes on matching them past the hit's last whole block takes those positions
too (the new request's own blocks hold them, so the engine's account covers the cells), never
its own last token, whose logits it needs.

An executor may keep its donors *detached*, outside the memory running sequences share (the
llama.cpp executor parks them in host memory, where they cost no attention and no cell):
:class:`ParkedDonorPool`. Such donors use no pool cells, so the rules above become:

- a detached donor keeps all its KV, partial block included, and is found by its tokens (and
  cache salt) as well as by its blocks: when the block manager reuses one of its blocks for a
  running request, only the way to find it by blocks is cut, so a prompt survives the pool
  filling up (before, it went with its blocks);
- a copy from a detached donor takes new cells. It reuses the hit's cached blocks only when no
  running sequence holds any of the donor's blocks (the cells it restores are then ones its
  account holds and nothing uses); otherwise it goes into blocks of the request's own, or a
  running holder of the hit's head serves it by sharing, whichever gives more positions;
- their host memory is bounded by the pool's own size in positions, counted per donor (each
  holds its whole KV, a head it shares with others included), the least recently used going
  first and a preempted request's last (it will run again, from it); a donor whose tokens a
  newer one starts with goes at once (a conversation's earlier turn), and a slot whose tokens a
  donor already holds is not kept.

Every change for the executor (free a slot, or trim it to N tokens) is queued and handed out by
:meth:`SlotPool.take_released`, which the engine applies before copies and the forward pass.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Sequence

from ruvllm.engine.block_manager import NO_HIT, BlockManager, PrefixHit
from ruvllm.tokenizer import common_prefix


class SlotPool:
    """Plain slots: a released slot is forgotten at once (paged layout, or no prefix cache).

    The lowest free slot is handed out first, which keeps the running sequences' ids packed
    together (llama.cpp with split KV streams runs consecutive ids as one micro-batch).
    """

    def __init__(self, num_slots: int):
        self._free = list(range(num_slots))  # a heap (sorted is a valid heap)
        #: ``(slot, tokens to keep)`` for the executor, in order: 0 frees the slot.
        self._released: list[tuple[int, int]] = []

    def acquire(self) -> int | None:
        return heapq.heappop(self._free) if self._free else None

    def release(self, slot: int, table: Sequence[int] = (), num_computed: int = 0,
                token_ids: Sequence[int] = (), cache_salt: str | None = None, *,
                resumes: bool = False) -> None:
        """``slot``'s request ended or was preempted (``resumes``: it waits to run again);
        ``table`` is the block table it had, ``num_computed`` how many of its positions hold
        KV, ``token_ids`` its tokens and ``cache_salt`` the salt they were computed under."""
        self._free_slot(slot)

    def take_released(self) -> list[tuple[int, int]]:
        """``(slot, keep)`` pairs the executor must apply before anything else uses the KV:
        ``keep == 0`` frees the slot, otherwise only its first ``keep`` positions stay."""
        out, self._released = self._released, []
        return out

    def donor_for(self, hit: PrefixHit, token_ids: Sequence[int] = (),
                  cache_salt: str | None = None) -> tuple[int | None, PrefixHit]:
        """A sequence whose KV holds ``hit`` (or its longest held head) to copy it from, and
        the hit as that sequence serves it: shortened to what it holds, or run on past the last
        whole block over the positions of ``token_ids`` (the prompt) it holds too; or a
        detached donor that holds more of the prompt under ``cache_salt``; ``(None, NO_HIT)``
        when none does."""
        return None, NO_HIT

    def end_step(self) -> None:
        return None

    @property
    def num_donors(self) -> int:
        return 0

    def _free_slot(self, slot: int) -> None:
        heapq.heappush(self._free, slot)
        self._released.append((slot, 0))


class DonorSlotPool(SlotPool):
    """Donors kept in the executor's own KV (MLX; llama.cpp with ``park_prefixes = false``):
    each holds its chain alone, which the block manager accounts."""

    def __init__(self, num_slots: int, max_donors: int, blocks: BlockManager):
        super().__init__(num_slots)
        self.max_donors = max_donors
        self.blocks = blocks
        #: Donor slot -> the cached blocks its KV holds, in position order (least recent first).
        self._chains: OrderedDict[int, list[int]] = OrderedDict()
        #: Block -> the donor slots whose KV holds it.
        self._holders: dict[int, set[int]] = {}
        #: Donor slot -> the tokens of the positions its KV keeps, and the cache salt they were
        #: computed under.
        self._tokens: dict[int, tuple[int, ...]] = {}
        self._salts: dict[int, str | None] = {}

    @property
    def num_donors(self) -> int:
        return len(self._chains)

    def release(self, slot: int, table: Sequence[int] = (), num_computed: int = 0,
                token_ids: Sequence[int] = (), cache_salt: str | None = None, *,
                resumes: bool = False) -> None:
        self._sync_evictions()
        blocks, bs = self.blocks, self.blocks.block_size
        chain: list[int] = []
        for b in table[:num_computed // bs]:
            if not blocks.is_cached(b):
                break
            chain.append(b)
        keep = self._positions_to_keep(chain, num_computed, token_ids, cache_salt)
        if not keep:
            chain = []
        for b in table[len(chain):]:
            # Cached, but this slot is about to lose its cells: nobody else may hold them.
            if blocks.is_cached(b) and blocks.ref_count(b) == 0 and not self._holders.get(b):
                blocks.uncache(b)
        if not keep:
            self._free_slot(slot)
            return
        self._chains[slot] = chain
        self._tokens[slot] = tuple(token_ids[:keep])
        self._salts[slot] = cache_salt
        for b in chain:
            self._holders.setdefault(b, set()).add(slot)
        self._kept(slot, keep, trimmed=num_computed > keep or len(table) > len(chain))

    def take_released(self) -> list[tuple[int, int]]:
        self._sync_evictions()
        return super().take_released()

    def donor_for(self, hit: PrefixHit, token_ids: Sequence[int] = (),
                  cache_salt: str | None = None) -> tuple[int | None, PrefixHit]:
        self._sync_evictions()
        bs = self.blocks.block_size
        token_ids = tuple(token_ids)  # compared with the donors' tuples, a slice at a time
        for n in range(len(hit.block_ids), 0, -1):
            last = hit.block_ids[n - 1]
            # A running sequence whose table holds a cached block has its KV: it computed the
            # block, or had it copied in before any step that could read it.
            running = self.blocks.holders(last)
            donors = self._donors_holding(last, running)
            if donors:
                donor = max(donors, key=list(self._chains).index)  # the most recently used
                self._chains.move_to_end(donor)
            elif running:
                donor = running[0]
            else:
                continue
            return donor, PrefixHit(hit.block_ids[:n], n * bs + self._run_on(donor, n * bs, token_ids))
        return None, NO_HIT

    def end_step(self) -> None:
        self._sync_evictions()
        # A donor whose every block another sequence holds too costs no memory, but a sequence id.
        for slot in [s for s in self._chains if self._only_here(s) == 0]:
            self._drop_donor(slot)
        while len(self._chains) > self.max_donors:
            # The donor whose going loses the fewest cached blocks (a shared system prompt's
            # latest user keeps the prompt; an earlier one holds only its own question), the
            # least recently used among equals.
            order = {s: i for i, s in enumerate(self._chains)}
            self._drop_donor(min(self._chains, key=lambda s: (self._only_here(s), order[s])))

    # ------------------------------------------------------------------ what the two kinds differ in

    def _positions_to_keep(self, chain: Sequence[int], num_computed: int, token_ids: Sequence[int],
                           cache_salt: str | None) -> int:
        """How many leading positions a released slot keeps as a donor (0: none)."""
        return len(chain) * self.blocks.block_size

    def _kept(self, slot: int, keep: int, *, trimmed: bool) -> None:
        """``slot`` became a donor of ``keep`` positions; ``trimmed``: it held more."""
        if trimmed:
            self._released.append((slot, keep))

    def _donors_holding(self, block: int, running: Sequence[int]) -> set[int]:
        """The donors that may serve a hit ending with ``block``, which ``running`` hold too."""
        return self._holders.get(block, set())

    def _cut(self, slot: int, cut: int) -> None:
        """The block manager reused block ``cut`` of ``slot``'s chain, now cut before it: its
        cells past the chain go (the engine no longer accounts them)."""
        if self._chains[slot]:
            self._tokens[slot] = self._tokens[slot][:cut * self.blocks.block_size]
            self._released.append((slot, cut * self.blocks.block_size))
        else:
            del self._chains[slot], self._tokens[slot], self._salts[slot]
            self._free_slot(slot)

    # ------------------------------------------------------------------ internals

    def _run_on(self, donor: int, start: int, token_ids: tuple[int, ...]) -> int:
        """How many positions from ``start`` the donor holds with the prompt's tokens, never the
        prompt's last token, whose logits the request needs (the new request's own blocks take
        them). A running holder's are not counted: its partial block is still being written."""
        return common_prefix(self._tokens.get(donor, ()), token_ids, len(token_ids) - 1, start) - start

    def _only_here(self, slot: int) -> int:
        """Blocks of ``slot``'s chain that no other sequence holds."""
        return sum(1 for b in self._chains[slot]
                   if self._holders[b] == {slot} and self.blocks.ref_count(b) == 0)

    def _sync_evictions(self) -> None:
        """The block manager reused cached blocks: cut every donor chain at each of them."""
        evicted, self.blocks.evicted = self.blocks.evicted, []
        for b in evicted:
            for slot in self._holders.pop(b, set()):
                chain = self._chains[slot]
                cut = chain.index(b)
                self._forget(slot, chain[cut + 1:])
                del chain[cut:]
                self._cut(slot, cut)

    def _drop_donor(self, slot: int) -> None:
        del self._tokens[slot], self._salts[slot]
        self._forget(slot, self._chains.pop(slot))
        self._free_slot(slot)

    def _forget(self, slot: int, chain: Sequence[int]) -> None:
        """``slot`` no longer holds ``chain``: a cached block nobody holds leaves the cache."""
        for b in chain:
            holders = self._holders.get(b)
            if holders is None:
                continue  # evicted in this same sync
            holders.discard(slot)
            if not holders:
                del self._holders[b]
                if self.blocks.ref_count(b) == 0:
                    self.blocks.uncache(b)


class ParkedDonorPool(DonorSlotPool):
    """Donors the executor keeps *detached*, outside the running sequences' memory (llama.cpp
    parks them in host memory): whole, found by their tokens too, bounded by positions."""

    def __init__(self, num_slots: int, max_donors: int, blocks: BlockManager):
        super().__init__(num_slots, max_donors, blocks)
        #: The positions all donors keep together: the pool's own size.
        self.host_tokens = blocks.num_blocks * blocks.block_size
        #: Donors of preempted requests, which will run again: the last to go.
        self._resuming: set[int] = set()

    def release(self, slot: int, table: Sequence[int] = (), num_computed: int = 0,
                token_ids: Sequence[int] = (), cache_salt: str | None = None, *,
                resumes: bool = False) -> None:
        super().release(slot, table, num_computed, token_ids, cache_salt)
        if resumes and slot in self._chains:
            self._resuming.add(slot)

    def donor_for(self, hit: PrefixHit, token_ids: Sequence[int] = (),
                  cache_salt: str | None = None) -> tuple[int | None, PrefixHit]:
        token_ids = tuple(token_ids)
        donor, served = super().donor_for(hit, token_ids, cache_salt)
        return self._donor_by_tokens(token_ids, cache_salt, served.num_tokens) or (donor, served)

    def end_step(self) -> None:
        self._sync_evictions()
        # Each holds all its KV, a head it shares with others too: the least recently used goes,
        # a preempted request's last (it comes back; its next turn's donor replaces it).
        while len(self._chains) > self.max_donors or sum(map(len, self._tokens.values())) > self.host_tokens:
            not_resuming = (s for s in self._chains if s not in self._resuming)
            self._drop_donor(next(not_resuming, next(iter(self._chains))))

    def _drop_donor(self, slot: int) -> None:
        self._resuming.discard(slot)
        super()._drop_donor(slot)

    def _positions_to_keep(self, chain: Sequence[int], num_computed: int, token_ids: Sequence[int],
                           cache_salt: str | None) -> int:
        # All its KV (it costs the pool nothing), unless too short for a restore to pay or
        # another donor holds it all.
        keep = min(num_computed, len(token_ids))
        if keep < self.blocks.block_size or self._covered(tuple(token_ids[:keep]), cache_salt):
            return 0
        return keep

    def _kept(self, slot: int, keep: int, *, trimmed: bool) -> None:
        self._released.append((slot, keep))  # parked now: the executor copies it out
        mine, salt = self._tokens[slot], self._salts[slot]
        for d in [d for d in self._chains if d != slot and self._salts[d] == salt]:
            theirs = self._tokens[d]
            if len(theirs) <= len(mine) and mine[:len(theirs)] == theirs:
                self._drop_donor(d)  # a conversation's earlier turn: this one holds all of it

    def _donors_holding(self, block: int, running: Sequence[int]) -> set[int]:
        # A restore onto the hit's blocks only where no running sequence holds any of the
        # donor's blocks: the cells it fills are then ones the account holds and nothing uses.
        if running:
            return set()
        return {d for d in self._holders.get(block, set())
                if not any(self.blocks.holders(b) for b in self._chains[d])}

    def _cut(self, slot: int, cut: int) -> None:
        pass  # its KV stays parked whole: only finding it by blocks is cut

    def _donor_by_tokens(self, token_ids: tuple[int, ...], cache_salt: str | None, beyond: int
                         ) -> tuple[int, PrefixHit] | None:
        """The donor that holds more of the prompt than ``beyond`` positions, at least a block,
        under the same salt (the most recently used among equals): one whose blocks were reused
        for other requests still holds its KV. Its leading blocks are shared where no running
        sequence holds them; the rest goes in the request's own blocks."""
        bs = self.blocks.block_size
        best, best_len = None, max(beyond, bs - 1)
        for d in reversed(self._chains):
            if self._salts[d] == cache_salt:
                n = common_prefix(self._tokens[d], token_ids, len(token_ids) - 1)
                if n > best_len:
                    best, best_len = d, n
        if best is None:
            return None
        chain = self._chains[best][:best_len // bs]
        if any(self.blocks.holders(b) for b in chain):
            chain = []  # restored beside a running copy, they would be held twice in one account
        self._chains.move_to_end(best)
        return best, PrefixHit(tuple(chain), best_len)

    def _covered(self, tokens: tuple[int, ...], salt: str | None) -> bool:
        """Whether a donor under ``salt`` holds ``tokens`` and maybe more."""
        return any(self._salts[d] == salt and self._tokens[d][:len(tokens)] == tokens for d in self._chains)

