"""One table per API surface: the shared core's field names in the words that surface's client sent.

Anthropic's Messages API, Ollama's, llama-server's and the Responses API run the chat (or
completion) request every surface runs, so a refusal raised on that shared path names a field of
that request: ``tools[1].function.name``, ``response_format.json_schema.schema``, ``max_tokens``.
Their clients never sent those. Each surface states its table once, the core's field -> its own
(``tools[*].function.name`` -> ``tools[*].name``), with the surface's field each chat message came
from (``messages[3]`` -> ``messages[2].content[1]``), and renames every refusal through it:
before anything runs (the 400) and inside a stream (the error event) alike.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping, Sequence

import attrs

from ruvllm.errors import InvalidRequest

#: Where a field's path may go on after a renamed prefix: its end, a subfield or an index.
_BOUNDARY = r"(?=$|[.\[])"
_MESSAGE = re.compile(r"^messages\[(\d+)\]")


def _pattern(core: str) -> re.Pattern[str]:
    """``core`` (``tools[*].function``: ``*`` any index) as a pattern on the start of a path."""
    return re.compile("^" + re.escape(core).replace(r"\[\*\]", r"\[(\d+)\]") + _BOUNDARY)


def _replacement(surface: str) -> str:
    """``surface`` with each ``[*]`` the index matched at the same place in the core's path."""
    parts = surface.split("[*]")
    return "".join(part + (f"[\\{i + 1}]" if i < len(parts) - 1 else "") for i, part in enumerate(parts))


@attrs.frozen
class FieldNames:
    """A surface's names for the shared core's fields; build it with :meth:`of`."""

    renames: tuple[tuple[re.Pattern[str], str], ...]
    #: The surface's field each chat message came from, by the message's index: a refusal of any
    #: part of that message names it whole (the chat message's inner fields, ``tool_calls`` and
    #: the like, are not the surface's).
    origins: tuple[str, ...] = ()
    #: Whole words in a refusal's reason to say in the surface's terms too (``max_tokens``).
    words: tuple[tuple[re.Pattern[str], str], ...] = ()

    @classmethod
    def of(cls, table: Mapping[str, str], origins: Sequence[str] = (),
           words: Mapping[str, str] | None = None) -> FieldNames:
        """``table``: the core's field (a path prefix, ``*`` for any index) -> the surface's; the
        longest prefix that matches a path renames it, and the rest of the path is kept."""
        ordered = sorted(table.items(), key=lambda kv: len(kv[0]), reverse=True)
        said = tuple((re.compile(rf"\b{re.escape(w)}\b"), mine) for w, mine in (words or {}).items())
        return cls(renames=tuple((_pattern(core), _replacement(mine)) for core, mine in ordered),
                   origins=tuple(origins), words=said)

    def field(self, core_field: str) -> str:
        """The surface's field that ``core_field`` (a path in the chat request) stands for."""
        message = _MESSAGE.match(core_field)
        if message is not None and int(message[1]) < len(self.origins):
            return self.origins[int(message[1])]
        for pattern, mine in self.renames:
            renamed, n = pattern.subn(mine, core_field, count=1)
            if n:
                return renamed
        return core_field

    def renamed(self, exc: InvalidRequest) -> InvalidRequest:
        """``exc`` naming the surface's field: the same error (its class and code kept, so a
        context overflow is still ``context_length_exceeded``), its field and message renamed."""
        field = self.field(exc.field)
        reason = str(exc).removeprefix(f"{exc.field}: ")
        for pattern, mine in self.words:
            reason = pattern.sub(mine, reason)
        exc.field = field
        exc.args = (f"{field}: {reason}",)
        return exc

    @contextlib.contextmanager
    def speaking(self) -> Iterator[None]:
        """Re-raise the refusals of the code inside in the surface's names."""
        try:
            yield
        except InvalidRequest as exc:
            self.renamed(exc)
            raise


def in_terms(item: object, names: FieldNames) -> object:
    """A stream's arrival with a refusal in it renamed (a token or a result unchanged)."""
    return names.renamed(item) if isinstance(item, InvalidRequest) else item
