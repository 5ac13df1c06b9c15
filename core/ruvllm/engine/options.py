"""ServingEngine options (the ``[engine]`` table of ruvllm.toml), validated on construction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ruvllm.engine.scheduler import Policy, SchedulerConfig
from ruvllm.errors import ConfigError

PATHS = ("auto", "executor", "request")


class EngineOptionError(ConfigError):
    """One ``[engine]`` option is unknown or out of range."""

    def __init__(self, field: str, message: str, value: Any = None):
        self.field = field
        self.value = value
        super().__init__(f"engine.{field}: {message}; set it in the [engine] table of ruvllm.toml")


def _int_at_least(low: int, *, optional: bool = False):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise EngineOptionError(attribute.name, f"must be an integer >= {low}, got {value!r}", value)

    return check


def _positive_seconds(optional: bool):
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None and optional:
            return
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise EngineOptionError(attribute.name, f"must be a number of seconds > 0, got {value!r}", value)

    return check


def _policy(value: Any) -> Policy:
    try:
        return Policy(value)
    except ValueError:
        raise EngineOptionError(
            "policy", f"must be one of {', '.join(p.value for p in Policy)}, got {value!r}", value
        ) from None


@attrs.frozen(kw_only=True)
class EngineOptions:
    #: Most requests running (holding KV) at once; also the executor's sequence count.
    max_num_seqs: int = attrs.field(default=16, validator=_int_at_least(1))
    #: Most tokens per forward pass (prefill chunks + decode tokens).
    max_batch_tokens: int = attrs.field(default=512, validator=_int_at_least(1))
    #: Tokens per KV block.
    block_size: int = attrs.field(default=16, validator=_int_at_least(1))
    #: KV capacity in blocks; None = what the executor offers.
    num_blocks: int | None = attrs.field(default=None, validator=_int_at_least(1, optional=True))
    policy: Policy = attrs.field(default=Policy.FCFS, converter=_policy)
    #: Seconds of waiting worth one priority level (see docs/engine.md, "aging").
    aging_interval: float = attrs.field(default=5.0, validator=_positive_seconds(False))
    #: Largest prefill chunk of one request per step (0 = no cap beyond the batch budget).
    max_prefill_chunk: int = attrs.field(default=0, validator=_int_at_least(0))
    #: Requests accepted but not yet running; one more is rejected with ``Overloaded``.
    max_queue: int = attrs.field(default=256, validator=_int_at_least(1))
    #: Default per-request deadline in seconds from submission (None = no deadline).
    request_timeout: float | None = attrs.field(default=None, validator=_positive_seconds(True))
    enable_prefix_caching: bool = True
    #: Per-sequence executors (llama.cpp): extra sequences that keep finished requests' cached
    #: prefixes alive for later hits (each costs one sequence's KV memory).
    prefix_donor_slots: int = attrs.field(default=2, validator=_int_at_least(0))
    #: Fraction of KV blocks kept free when admitting a new request.
    watermark: float = attrs.field(default=0.01)
    #: Request-level path: most backend ``generate`` streams interleaved at once (1 when the
    #: backend does not declare ``concurrent_requests``).
    max_in_flight: int = attrs.field(default=8, validator=_int_at_least(1))
    #: "auto" (executor when the backend has one), "executor" or "request".
    path: str = attrs.field(default="auto")

    @watermark.validator
    def _check_watermark(self, attribute: attrs.Attribute, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise EngineOptionError("watermark", f"must be a fraction in [0, 1), got {value!r}", value)

    @path.validator
    def _check_path(self, attribute: attrs.Attribute, value: Any) -> None:
        if value not in PATHS:
            raise EngineOptionError("path", f"must be one of {', '.join(PATHS)}, got {value!r}", value)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> EngineOptions:
        known = {f.name for f in attrs.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise EngineOptionError(unknown[0], f"unknown option; known: {', '.join(sorted(known))}")
        return cls(**values)

    def scheduler_config(self, max_num_seqs: int, max_batch_tokens: int) -> SchedulerConfig:
        return SchedulerConfig(
            max_batch_tokens=max_batch_tokens,
            max_num_seqs=max_num_seqs,
            policy=self.policy,
            aging_interval=self.aging_interval,
            max_prefill_chunk=self.max_prefill_chunk,
        )
