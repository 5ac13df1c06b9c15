"""What the server keeps of one kind by id (stored responses, conversations): the newest
``capacity`` of them in memory, the oldest forgotten first, and a lookup of one that is gone
answered with how many the server keeps and which setting says so."""

from __future__ import annotations

from collections import OrderedDict
from typing import Generic, TypeVar

from ruvllm.errors import StoredObjectNotFound

T = TypeVar("T")


class NewestKept(Generic[T]):
    """The newest ``capacity`` objects by id (0: none are kept)."""

    def __init__(self, capacity: int, *, kind: str, setting: str, advice: str):
        """``kind`` names one object (``response``), ``setting`` the ``[server]`` key that sets
        ``capacity``, ``advice`` what a client does without the one it asked for."""
        self.capacity = capacity
        self._kind, self._setting, self._advice = kind, setting, advice
        self._kept: OrderedDict[str, T] = OrderedDict()

    def put(self, key: str, value: T) -> list[T]:
        """Keep ``value``; the objects forgotten to make room for it."""
        self._kept[key] = value
        forgotten = []
        while len(self._kept) > self.capacity:
            forgotten.append(self._kept.popitem(last=False)[1])
        return forgotten

    def get(self, key: str) -> T:
        value = self._kept.get(key)
        if value is None:
            kept = (f"keeps no {self._kind}s ([server] {self._setting} = 0)" if self.capacity == 0 else
                    f"keeps the newest {self.capacity} {self._kind}s ([server] {self._setting})")
            raise StoredObjectNotFound(self._kind, key, f"this server {kept}; {self._advice}")
        return value

    def delete(self, key: str) -> T:
        """Forget ``key``'s object (a 404 if it is not kept); the object forgotten."""
        value = self.get(key)
        del self._kept[key]
        return value

    def values(self) -> list[T]:
        return list(self._kept.values())
