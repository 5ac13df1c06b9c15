"""ruvllm.options: one parser and one set of validators for every backend's options table."""

from __future__ import annotations

from typing import ClassVar

import attrs
import pytest
from ruvllm.errors import BackendOptionError, ConfigError
from ruvllm.options import (
    accepts,
    any_of,
    boolean,
    float_range,
    int_range,
    one_of,
    optional,
    parse_options,
    positive_int,
)


@attrs.frozen(kw_only=True)
class ToyOptions:
    """A declaration in the shape the backends use: every check is a core validator."""

    BACKEND: ClassVar[str] = "toy"

    threads: int = attrs.field(default=2, validator=positive_int())
    layers: int = attrs.field(default=0, validator=int_range(-1, note="-1 = all"))
    bits: int = attrs.field(default=4, validator=one_of((4, 8)))
    mode: str = attrs.field(default="auto", validator=one_of(("auto", "fast")))
    fraction: float = attrs.field(default=0.5, validator=float_range(0.0, 1.0, low_open=True))
    verbose: bool = attrs.field(default=False, validator=boolean())
    limit: int | None = attrs.field(default=None, validator=optional(int_range(1, 64)))
    goal: float | str | None = attrs.field(
        default=None,
        validator=optional(any_of(float_range(0.0, 1.0), accepts("a size such as \"4GiB\"",
                                                                 lambda v: str(v).endswith("GiB")))),
    )


@attrs.frozen
class Undeclared:
    """An options class without BACKEND: parse_options still names the table it parsed."""

    size: int = attrs.field(default=1, validator=positive_int())


def test_defaults_and_good_values_parse():
    assert parse_options(ToyOptions, "toy", {}) == ToyOptions()
    opts = parse_options(ToyOptions, "toy", {
        "threads": 8, "layers": -1, "bits": 8, "mode": "fast", "fraction": 1, "verbose": True,
        "limit": 64, "goal": "4GiB",
    })
    assert (opts.threads, opts.layers, opts.bits, opts.mode) == (8, -1, 8, "fast")
    assert (opts.fraction, opts.verbose, opts.limit, opts.goal) == (1, True, 64, "4GiB")
    assert parse_options(ToyOptions, "toy", {"goal": 0.25}).goal == 0.25


def test_unknown_key_lists_the_known_ones():
    with pytest.raises(BackendOptionError) as err:
        parse_options(ToyOptions, "toy", {"treads": 4, "zzz": 1})
    assert isinstance(err.value, ConfigError)
    assert (err.value.backend, err.value.option, err.value.value) == ("toy", "treads", 4)
    assert str(err.value).startswith("backends.toy.treads: unknown option (known options: bits, fraction, "
                                     "goal, layers, limit, mode, threads, verbose)")
    assert "remove it" in str(err.value)


@pytest.mark.parametrize(
    ("options", "option", "accepted"),
    [
        ({"threads": 0}, "threads", "must be an integer >= 1, got 0 (int)"),
        ({"threads": "4"}, "threads", "must be an integer >= 1, got '4' (str)"),
        ({"threads": True}, "threads", "must be an integer >= 1, got True (bool)"),
        ({"threads": 2.0}, "threads", "must be an integer >= 1, got 2.0 (float)"),
        ({"layers": -2}, "layers", "must be an integer >= -1 (-1 = all), got -2"),
        ({"bits": 5}, "bits", "must be one of 4, 8, got 5"),
        ({"bits": 4.0}, "bits", "must be one of 4, 8, got 4.0 (float)"),
        ({"mode": "slow"}, "mode", "must be one of auto, fast, got 'slow'"),
        ({"fraction": 0.0}, "fraction", "must be a number in (0.0, 1.0], got 0.0"),
        ({"fraction": 1.5}, "fraction", "must be a number in (0.0, 1.0], got 1.5"),
        ({"fraction": False}, "fraction", "must be a number in (0.0, 1.0], got False (bool)"),
        ({"verbose": 1}, "verbose", "must be true or false, got 1 (int)"),
        ({"verbose": "yes"}, "verbose", "must be true or false, got 'yes' (str)"),
        ({"limit": 65}, "limit", "must be an integer in [1, 64], or left unset, got 65"),
        ({"goal": "lots"}, "goal",
         "must be a number in [0.0, 1.0] or a size such as \"4GiB\", or left unset, got 'lots'"),
    ],
)
def test_rejected_value_names_backend_option_and_accepted_range(options, option, accepted):
    with pytest.raises(BackendOptionError) as err:
        parse_options(ToyOptions, "toy", options)
    assert (err.value.backend, err.value.option, err.value.field) == ("toy", option, option)
    assert err.value.value == options[option]
    message = str(err.value)
    assert message.startswith(f"backends.toy.{option}: {accepted}")
    fix = f"set it in the [backends.toy] table of ruvllm.toml or with --option {option}=VALUE"
    assert message.endswith(fix)


def test_direct_construction_uses_the_declared_backend():
    with pytest.raises(BackendOptionError, match=r"^backends\.toy\.bits: must be one of 4, 8"):
        ToyOptions(bits=3)


def test_class_without_backend_is_reported_under_the_parsed_name():
    with pytest.raises(BackendOptionError) as err:
        parse_options(Undeclared, "other", {"size": 0})
    assert (err.value.backend, err.value.option) == ("other", "size")
    assert str(err.value).startswith("backends.other.size: must be an integer >= 1, got 0")
    assert parse_options(Undeclared, "other", {"size": 3}).size == 3


def test_plugin_cross_field_error_keeps_its_own_fix():
    err = BackendOptionError("toy", "hot", "must be <= cold (4)", 9, fix="lower hot")
    assert str(err) == "backends.toy.hot: must be <= cold (4); lower hot"
    assert err.reason == "must be <= cold (4)"


def test_only_attrs_classes_are_parsed():
    with pytest.raises(TypeError, match="attrs class"):
        parse_options(dict, "toy", {})
