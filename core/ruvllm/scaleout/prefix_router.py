"""Prefix-cache affinity: which replica a prompt should go to (pure policy, no Ray).

A replica's prefix cache only helps the requests that reach it. Prompts that share their first
KV blocks (a system prompt, a few-shot preamble, a long document asked many questions) are
hashed to the same key, and each key has a home replica. A key seen for the first time goes
to the replica that is home to the fewest recently seen keys (rendezvous hashing breaks ties),
and stays there while that replica lives. Placing keys by hash alone was measured to lose to
Serve's random router: 4 system prompts hashed onto 2 replicas split 3/1 or 4/0 about five
times in eight, and a replica keeping 2 prompts for reuse then evicted one for another on
every switch. When the home replica is busy (its queue at or above ``busy_threshold`` while
another replica has fewer requests) the request goes to the least-loaded replica instead:
affinity saves prefill, but never at the price of queueing behind a hot replica.
"""

from __future__ import annotations

import hashlib
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from typing import ClassVar

import attrs

from ruvllm.options import positive_int


def prefix_key(prompt_ids: Sequence[int], *, block_size: int, blocks: int,
               cache_salt: str | None = None) -> str | None:
    """Hash of the prompt's first ``blocks`` KV blocks, or None when the prompt is shorter.

    The key must cover shared tokens only: a key that reaches into the part where prompts differ
    (the user's question after a short system prompt) scatters them. So it is short (3 blocks,
    48 tokens, by default) and a shorter prompt gets no key at all (least-loaded routing): with
    fewer blocks, every chat that starts with the same template header and default system
    prompt would share one key and pile onto one replica. The salt is part of the key because
    the engine never shares cached blocks across salts.
    """
    full = len(prompt_ids) // block_size
    if full < blocks:
        return None
    full = blocks
    h = hashlib.blake2b(digest_size=12)
    h.update((cache_salt or "").encode("utf-8") + b"\0")
    h.update(b"".join(int(t).to_bytes(4, "little", signed=True) for t in prompt_ids[: full * block_size]))
    return h.hexdigest()


def tenant_key(tenant: str) -> str:
    """The routing key of every request of ``tenant`` when tenants are routed as a whole (a
    learning plugin keeps each tenant's adapter in the replica that served its feedback)."""
    return hashlib.blake2b(b"tenant\0" + tenant.encode("utf-8"), digest_size=12).hexdigest()


def _weight(key: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{replica}".encode(), digest_size=8).digest(), "little")


@attrs.define(kw_only=True)
class AffinityPolicy:
    """Rank replicas for one request: the key's home replica first unless it is busy.

    It remembers the home of the last ``memory`` keys, so it is one router's state: several
    routers (several ``ruvllm serve --ray`` processes) each learn their own placement, which costs hit rate
    where they disagree, never correctness.
    """

    TABLE: ClassVar[str] = "ray.prefix_router"

    #: Queue length (ongoing requests) from which the home replica counts as busy.
    busy_threshold: int = attrs.field(default=4, validator=positive_int())
    #: How many keys' homes are remembered (least recently used forgotten first).
    memory: int = attrs.field(default=1024, validator=positive_int())
    _homes: OrderedDict[str, str] = attrs.field(factory=OrderedDict, init=False, repr=False)
    #: Turns the order of equally loaded replicas once per unkeyed request (see ``rank``).
    _turn: int = attrs.field(default=0, init=False, repr=False)

    def home(self, key: str, replicas: Sequence[str]) -> str:
        """The replica ``key`` belongs to: where it went before while that replica is live,
        else the one that is home to the fewest remembered keys (highest rendezvous weight
        among those), which is then remembered."""
        known = self._homes.get(key)
        if known is not None and known in replicas:
            self._homes.move_to_end(key)
            return known
        owned = Counter(r for r in self._homes.values() if r in replicas)
        home = min(replicas, key=lambda r: (owned[r], -_weight(key, r)))
        self._homes[key] = home
        self._homes.move_to_end(key)
        while len(self._homes) > self.memory:
            self._homes.popitem(last=False)
        return home

    def rank(self, key: str | None, loads: Mapping[str, int | None]) -> list[list[str]]:
        """Ranks of replica ids, most preferred first; ``loads`` maps every candidate to its
        queue length (None when unknown, treated as idle).

        Without a key every replica is equally good: one rank, least-loaded first, equally
        loaded replicas taking turns at the front: Serve takes the first of a rank's least-loaded
        replicas, and the queue lengths it knows do not change between requests sent at once, so
        a fixed order sent a burst of unkeyed requests all to one replica (seen on two nodes).
        """
        if not loads:
            return []
        names = sorted(loads)
        if key is None:
            self._turn += 1
            return [sorted(names, key=lambda r: (loads[r] or 0, (names.index(r) - self._turn) % len(names)))]
        by_load = sorted(names, key=lambda r: (loads[r] or 0, r))
        home = self.home(key, sorted(loads))
        home_load = loads[home] or 0
        least = loads[by_load[0]] or 0
        rest = [r for r in by_load if r != home]
        if home_load >= self.busy_threshold and least < home_load:
            return [rest, [home]]
        return [[home], rest] if rest else [[home]]
