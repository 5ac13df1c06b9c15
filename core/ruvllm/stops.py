"""Stop-string matching across token boundaries, shared by every backend and the engine."""

from __future__ import annotations

from collections.abc import Sequence


class StopStringMatcher:
    """Finds stop strings in streamed text and holds back what could still become one.

    A stop string may arrive split over several tokens ("###" as "#" + "##"), so text that ends
    with a proper prefix of any stop string is withheld until the next delta decides it. The
    stop string itself and anything after it are never emitted (OpenAI semantics).
    """

    def __init__(self, stops: Sequence[str]):
        self._stops = tuple(stops)
        self._longest = max((len(s) for s in self._stops), default=0)
        self._pending = ""
        self.matched: str | None = None

    def feed(self, delta: str) -> str:
        """Add newly decoded text; return the part that is safe to emit.

        After a match, :attr:`matched` is set and the returned text ends just before the stop.
        """
        if self.matched is not None:
            return ""
        if not self._stops:
            return delta
        text = self._pending + delta
        first: tuple[int, str] | None = None
        for stop in self._stops:
            at = text.find(stop)
            if at != -1 and (first is None or at < first[0]):
                first = (at, stop)
        if first is not None:
            self.matched = first[1]
            self._pending = ""
            return text[: first[0]]
        hold = self._held_suffix(text)
        self._pending = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def flush(self) -> str:
        """Release held-back text at the end of generation."""
        out, self._pending = self._pending, ""
        return "" if self.matched is not None else out

    def _held_suffix(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        for n in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(stop.startswith(tail) for stop in self._stops):
                return n
        return 0
