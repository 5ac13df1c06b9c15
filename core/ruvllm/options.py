"""One way to parse and validate an options table of ruvllm.toml: every backend's
``[backends.<name>]``, the engine's ``[engine]`` and plugins' own tables (``[sona]``).

Options arrive from TOML or ``--option KEY=VALUE`` as loosely typed values. A wrong one must
fail before any weights are read, with the same error type for the same mistake whichever
table it is in: :class:`~ruvllm.errors.OptionError` (:class:`~ruvllm.errors.BackendOptionError`
for a backend, :class:`~ruvllm.errors.EngineOptionError` for the engine), naming
``<table>.<option>``, what was wrong and what is accepted.

An options class is an attrs class whose fields use the validators below. A backend sets
``BACKEND: ClassVar[str]`` to its name (so that even direct construction names the backend) and
parses a mapping with :func:`parse_options`; other tables set ``TABLE: ClassVar[str]`` (``"engine"``,
``"sona"``) and parse with :func:`parse_table`. Checks that relate several fields stay in the
class (``__attrs_post_init__``) and raise :func:`option_error` (or the plugin's
:class:`~ruvllm.errors.BackendOptionError`) too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import attrs

from ruvllm.errors import BackendOptionError, OptionError

T = TypeVar("T")

__all__ = [
    "Accepts", "BackendOptionError", "OptionError", "accepts", "any_of", "backend_of", "boolean",
    "float_range", "int_range", "is_int", "one_of", "option_error", "optional", "parse_options",
    "parse_table", "positive_int", "table_of",
]


def parse_options(cls: type[T], backend: str, mapping: Mapping[str, Any]) -> T:
    """Build the attrs options class ``cls`` of ``backend`` from its ``[backends.<backend>]``
    table ``mapping`` (see :func:`parse_table`)."""
    return _parse(cls, f"backends.{backend}", mapping)


def parse_table(cls: type[T], mapping: Mapping[str, Any]) -> T:
    """Build the attrs options class ``cls`` from its own table (``cls.TABLE``, e.g. ``[engine]``).

    Unknown keys are rejected with the list of known ones (a typo must not silently fall back
    to a default); a value a validator rejects is reported under the table and the option.
    """
    return _parse(cls, table_of(cls), mapping)


def _parse(cls: type[T], table: str, mapping: Mapping[str, Any]) -> T:
    if not attrs.has(cls):
        raise TypeError(f"options are parsed into an attrs class, got {cls!r}")
    known = sorted(f.name for f in attrs.fields(cls) if f.init)
    unknown = sorted(set(mapping) - set(known))
    if unknown:
        name = unknown[0]
        raise OptionError.for_table(
            table, name, f"unknown option (known options: {', '.join(known)})", mapping[name],
            fix=f"remove it or use one of the known names in the [{table}] table",
        )
    try:
        return cls(**dict(mapping))
    except OptionError as err:
        if err.table == table:
            raise
        # A class without BACKEND (or with another one) is still reported under the name it
        # was parsed for, which is the table the user has to edit.
        raise OptionError.for_table(table, err.option, err.reason, err.value) from None


def backend_of(instance: Any) -> str:
    """The backend an options instance belongs to: its class's ``BACKEND``, else the class name."""
    return getattr(type(instance), "BACKEND", None) or type(instance).__name__


def table_of(owner: Any) -> str:
    """The ruvllm.toml table of an options class or instance: ``backends.<BACKEND>`` for a
    backend's, ``TABLE`` for the others (an undeclared class: ``backends.<class name>``)."""
    cls = owner if isinstance(owner, type) else type(owner)
    if getattr(cls, "BACKEND", None):
        return f"backends.{cls.BACKEND}"
    return getattr(cls, "TABLE", None) or f"backends.{cls.__name__}"


def option_error(owner: Any, option: str, reason: str, value: Any = None, *,
                 fix: str | None = None) -> OptionError:
    """The error for ``option`` of the options class (or instance) ``owner``, in its table."""
    return OptionError.for_table(table_of(owner), option, reason, value, fix=fix)


def is_int(value: Any) -> bool:
    """An integer proper: TOML's ``true`` is a bool, and bools are ints in Python."""
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _describe(value: Any) -> str:
    # The type matters for values read from TOML or the command line: "8" is not 8.
    return f"{value!r} ({type(value).__name__})"


@attrs.frozen
class Accepts:
    """An attrs validator: ``test`` decides, ``accepted`` completes "must be ..." in the error."""

    accepted: str
    test: Callable[[Any], bool]

    def __call__(self, instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if not self.test(value):
            raise option_error(instance, attribute.name, f"must be {self.accepted}, got {_describe(value)}",
                               value)


def accepts(accepted: str, test: Callable[[Any], bool]) -> Accepts:
    """A validator for a rule the others do not cover, with the same error shape."""
    return Accepts(accepted, test)


def int_range(low: int | None = None, high: int | None = None, *, note: str | None = None) -> Accepts:
    """An integer in ``[low, high]`` (either bound may be open-ended); ``note`` explains values."""
    if low is not None and high is not None:
        accepted = f"an integer in [{low}, {high}]"
    elif low is not None:
        accepted = f"an integer >= {low}"
    elif high is not None:
        accepted = f"an integer <= {high}"
    else:
        accepted = "an integer"
    if note:
        accepted += f" ({note})"
    return Accepts(
        accepted, lambda v: is_int(v) and (low is None or v >= low) and (high is None or v <= high)
    )


def positive_int() -> Accepts:
    """An integer >= 1 (counts, sizes, threads)."""
    return int_range(1)


def float_range(
    low: float | None = None, high: float | None = None, *, low_open: bool = False, high_open: bool = False,
    note: str | None = None,
) -> Accepts:
    """A number (int or float, not bool) between ``low`` and ``high``; ``*_open`` excludes a bound;
    ``note`` explains values (e.g. the unit)."""
    left = f"{'(' if low_open else '['}{low if low is not None else '-inf'}"
    right = f"{high if high is not None else 'inf'}{')' if high_open else ']'}"

    def test(v: Any) -> bool:
        if not _is_number(v):
            return False
        if low is not None and (v <= low if low_open else v < low):
            return False
        return high is None or (v < high if high_open else v <= high)

    return Accepts(f"a number in {left}, {right}" + (f" ({note})" if note else ""), test)


def boolean() -> Accepts:
    """``true`` or ``false`` exactly: 1, "yes" and "on" are rejected, not guessed at."""
    return Accepts("true or false", lambda v: isinstance(v, bool))


def one_of(choices: tuple[Any, ...]) -> Accepts:
    """One of ``choices``, compared with its type too (so ``4.0`` or ``True`` is not ``4`` or ``1``)."""
    listed = ", ".join(c if isinstance(c, str) else repr(c) for c in choices)
    return Accepts(
        f"one of {listed}",
        lambda v: any(type(v) is type(c) and v == c for c in choices),
    )


def optional(validator: Accepts) -> Accepts:
    """``validator``, or None (the option left unset)."""
    return Accepts(
        f"{validator.accepted}, or left unset", lambda v: v is None or validator.test(v)
    )


def any_of(*validators: Accepts) -> Accepts:
    """A value any one of ``validators`` accepts (an option with two spellings)."""
    return Accepts(
        " or ".join(v.accepted for v in validators), lambda v: any(val.test(v) for val in validators)
    )
