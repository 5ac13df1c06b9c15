"""Prefix-cache affinity: which replica a prompt should go to (pure policy, no Ray).

A replica's prefix cache only helps the requests that reach it. Prompts that share their first
KV blocks (a system prompt, a few-shot preamble, a long document asked many questions) are
hashed to the same key, and the key picks a replica by rendezvous hashing: every router
computes the same choice without shared state, and when a replica leaves only its own keys
move. When the preferred replica is busy (its queue at or above ``busy_threshold`` while
another replica has fewer requests) the request goes to the least-loaded replica instead:
affinity saves prefill, but never at the price of queueing behind a hot replica.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence

import attrs

from ruvllm.errors import ConfigError


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


def _weight(key: str, replica: str) -> int:
    return int.from_bytes(hashlib.blake2b(f"{key}|{replica}".encode(), digest_size=8).digest(), "little")


@attrs.frozen(kw_only=True)
class AffinityPolicy:
    """Rank replicas for one request: the key's home replica first unless it is busy."""

    #: Queue length (ongoing requests) from which the home replica counts as busy.
    busy_threshold: int = attrs.field(default=4)

    @busy_threshold.validator
    def _check(self, _attr: object, value: int) -> None:
        if not isinstance(value, int) or value < 1:
            raise ConfigError(f"prefix router busy_threshold must be an integer >= 1, got {value!r}")

    def home(self, key: str, replicas: Sequence[str]) -> str:
        """The replica ``key`` belongs to (highest rendezvous weight)."""
        return max(replicas, key=lambda r: _weight(key, r))

    def rank(self, key: str | None, loads: Mapping[str, int | None]) -> list[list[str]]:
        """Ranks of replica ids, most preferred first; ``loads`` maps every candidate to its
        queue length (None when unknown, treated as idle).

        Without a key every replica is equally good: one rank, least-loaded first.
        """
        if not loads:
            return []
        by_load = sorted(loads, key=lambda r: (loads[r] or 0, r))
        if key is None:
            return [by_load]
        home = self.home(key, sorted(loads))
        home_load = loads[home] or 0
        least = loads[by_load[0]] or 0
        rest = [r for r in by_load if r != home]
        if home_load >= self.busy_threshold and least < home_load:
            return [rest, [home]]
        return [[home], rest] if rest else [[home]]
