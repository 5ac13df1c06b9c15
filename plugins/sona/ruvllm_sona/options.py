"""SONA options: the ``[sona]`` table of ruvllm.toml (or ``SonaOptions(...)`` in Python).

Every value is validated with an error naming the key and what it accepts.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs
from ruvllm.errors import ConfigError
from ruvllm_candle_like.lora import TARGETS

TRAIN_DTYPES = ("auto", "float32", "bfloat16", "float16")


def _check(cond: bool, key: str, what: str, value: Any) -> None:
    if not cond:
        raise ConfigError(f"[sona] {key}: must be {what}, got {value!r}")


def _positive_int(inst: Any, attr: attrs.Attribute, v: Any) -> None:
    _check(isinstance(v, int) and not isinstance(v, bool) and v >= 1, attr.name, "an integer >= 1", v)


def _non_negative(inst: Any, attr: attrs.Attribute, v: Any) -> None:
    _check(isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0, attr.name, "a number >= 0", v)


def _unit_interval(inst: Any, attr: attrs.Attribute, v: Any) -> None:
    _check(isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1, attr.name,
           "a number in [0, 1]", v)


def _targets(inst: Any, attr: attrs.Attribute, v: Any) -> None:
    _check(isinstance(v, tuple) and len(v) > 0 and all(t in TARGETS for t in v), attr.name,
           f"a non-empty list of {', '.join(TARGETS)}", v)


@attrs.frozen(kw_only=True)
class SonaOptions:
    #: Attach SONA to engines built from this config (``ServingEngine.from_config``).
    enabled: bool = False
    #: Name the learned adapter is published under.
    adapter_name: str = "sona"
    #: Which requests run with the learned adapter: "all" (every request that names none),
    #: "routed" (only those the pattern bank routes), "explicit" (only adapter="sona").
    apply: str = attrs.field(default="all", validator=attrs.validators.in_(("all", "routed", "explicit")))
    #: MicroLoRA rank (1 or 2 in SONA's design), scaling alpha and target projections.
    rank: int = attrs.field(default=2, validator=_positive_int)
    alpha: float = attrs.field(default=4.0, validator=_non_negative)
    targets: tuple[str, ...] = attrs.field(default=("q_proj", "v_proj"), converter=tuple, validator=_targets)
    #: Compute dtype of training (auto | float32 | bfloat16 | float16). auto: the served model's
    #: dtype, except bfloat16 on a CPU without native bf16 (where its backward falls to a slow
    #: reference gemm): there float32, as the backend's own ``dtype = "auto"`` picks. A dtype other
    #: than the model's trains on a copy of the weights in it (memory: one more model).
    dtype: str = attrs.field(default="auto", validator=attrs.validators.in_(TRAIN_DTYPES))
    #: Adam learning rate and gradient steps per background run.
    learning_rate: float = attrs.field(default=5e-3, validator=_non_negative)
    steps_per_update: int = attrs.field(default=4, validator=_positive_int)
    #: Rated trajectories per gradient step (most recent first) and longest sequence trained on.
    batch_size: int = attrs.field(default=16, validator=_positive_int)
    max_seq_len: int = attrs.field(default=192, validator=_positive_int)
    #: Background loop period (seconds) and the least new feedback that triggers a run.
    interval: float = attrs.field(default=2.0, validator=_non_negative)
    min_feedback: int = attrs.field(default=4, validator=_positive_int)
    #: EWC++: penalty strength (0 disables it), Fisher decay, sequences per Fisher estimate.
    ewc_lambda: float = attrs.field(default=3e4, validator=_non_negative)
    fisher_decay: float = attrs.field(default=0.9, validator=_unit_interval)
    fisher_batch: int = attrs.field(default=4, validator=_positive_int)
    #: Deep loop: run after this many feedbacks (0: only on demand), base LoRA rank, patterns.
    deep_every: int = attrs.field(default=0, validator=attrs.validators.ge(0))
    base_rank: int = attrs.field(default=8, validator=_positive_int)
    max_patterns: int = attrs.field(default=4, validator=_positive_int)
    route_threshold: float = attrs.field(default=0.85, validator=_unit_interval)
    #: Trajectories kept for learning (oldest dropped).
    capacity: int = attrs.field(default=4096, validator=_positive_int)
    #: Where ``save`` writes PEFT directories by default.
    save_dir: str | None = None
    seed: int = 0

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> SonaOptions:
        """From the ``[sona]`` table; unknown keys are an error listing the known ones."""
        fields = {f.name for f in attrs.fields(cls)}
        if unknown := sorted(set(values or {}) - fields):
            raise ConfigError(f"[sona]: unknown key(s) {', '.join(unknown)}; "
                              f"known: {', '.join(sorted(fields))}")
        try:
            return cls(**dict(values or {}))
        except (TypeError, ValueError) as exc:  # attrs' own type errors, e.g. a misspelt value type
            raise ConfigError(f"[sona]: {exc}") from None
