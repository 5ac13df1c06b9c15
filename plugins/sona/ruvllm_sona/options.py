"""SONA options: the ``[sona]`` table of ruvllm.toml (or ``SonaOptions(...)`` in Python).

Validated with core's option helper (:mod:`ruvllm.options`), as the engine's and the backends'
tables are: a bad value is an :class:`~ruvllm.errors.OptionError` naming ``sona.<key>`` and what it
accepts; an unknown key lists the known ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs
import torch
from ruvllm.options import (
    accepts,
    any_of,
    boolean,
    float_range,
    int_range,
    is_int,
    one_of,
    parse_table,
    positive_int,
)
from ruvllm_candle_like.lora import TARGETS

TRAIN_DTYPES = ("auto", "float32", "bfloat16", "float16")
#: ``ewc_lambda = "auto"`` per training dtype (any other dtype takes the half-precision figure).
AUTO_EWC_LAMBDA = {torch.float32: 3e4, torch.bfloat16: 5e4}

_non_negative = float_range(0)
_unit_interval = float_range(0, 1)
_targets = accepts(f"a non-empty list of {', '.join(TARGETS)}",
                   lambda v: isinstance(v, tuple) and len(v) > 0 and all(t in TARGETS for t in v))


def _tuple(value: Any) -> Any:
    """A list (TOML array) as a tuple; anything else is left for the validator to refuse."""
    return tuple(value) if isinstance(value, (list, tuple)) else value


@attrs.frozen(kw_only=True)
class SonaOptions:
    """The training defaults are the settings ``benchmarks/sona_learning.py`` measures (and reads
    from here): an update after every 32 new scores (2 Adam steps, batch 8, lr 2e-2, rank 2 on
    o_proj of the last 8 layers, EWC++ lambda 5e4 training in bf16 and 3e4 in float32) and a
    consolidation after it. The earlier defaults (lr 5e-3, 4 steps of 16 on every layer, lambda
    3e4, an update every 4 scores) were never measured; run through the benchmark's schedule they
    drifted +28 % on general text (docs/sona.md)."""

    TABLE: ClassVar[str] = "sona"

    #: Attach SONA to engines built from this config (``ServingEngine.from_config``).
    enabled: bool = attrs.field(default=False, validator=boolean())
    #: Name the learned adapter is published under.
    adapter_name: str = attrs.field(
        default="sona", validator=accepts("a non-empty name", lambda v: isinstance(v, str) and v != ""))
    #: Which requests run with the learned adapter: "all" (every request that names none),
    #: "routed" (only those the pattern bank routes), "explicit" (only adapter="sona").
    apply: str = attrs.field(default="all", validator=one_of(("all", "routed", "explicit")))
    #: MicroLoRA rank (1 or 2 in SONA's design), scaling alpha and target projections. o_proj alone
    #: (q_proj and v_proj until 2026-11-28): in docs/sona.md's benchmark it learned more on held-out
    #: subjects (4.2x against 2.9-3.6x, bf16) with 60 % of the adapter, at a drift closer to 5 %.
    rank: int = attrs.field(default=2, validator=positive_int())
    alpha: float = attrs.field(default=4.0, validator=_non_negative)
    targets: tuple[str, ...] = attrs.field(default=("o_proj",), converter=_tuple, validator=_targets)
    #: Adapt only the last ``layers`` transformer layers (0: every layer). Backward then stops at
    #: the first adapted layer: on 2 CPU cores a step on the last 8 of SmolLM2-135M's 30 layers took
    #: ~1.7 s against ~3.1 s for all 30 (batch 8 of 56 tokens, float32).
    layers: int = attrs.field(default=8, validator=int_range(0))
    #: Compute dtype of training (auto | float32 | bfloat16 | float16). auto: the served model's
    #: dtype, except bfloat16 on a CPU without native bf16 (where its backward falls to a slow
    #: reference gemm): there float32, as the backend's own ``dtype = "auto"`` picks. A dtype other
    #: than the model's trains on a copy of the weights in it (memory: one more model).
    dtype: str = attrs.field(default="auto", validator=one_of(TRAIN_DTYPES))
    #: Adam learning rate and gradient steps per background run.
    learning_rate: float = attrs.field(default=2e-2, validator=_non_negative)
    steps_per_update: int = attrs.field(default=2, validator=positive_int())
    #: Rated trajectories per gradient step (most recent first) and longest sequence trained on.
    batch_size: int = attrs.field(default=8, validator=positive_int())
    max_seq_len: int = attrs.field(default=192, validator=positive_int())
    #: Background loop period (seconds) and the least new feedback that triggers a run.
    interval: float = attrs.field(default=2.0, validator=_non_negative)
    min_feedback: int = attrs.field(default=32, validator=positive_int())
    #: Longest a due background run waits for the engine to be idle (no running or waiting
    #: request), in seconds; 0: it runs at once. Training shares the serving CPU cores, so a run
    #: that waits leaves them to serving (benchmarks/sona_learning.py measures both ways).
    defer_while_busy: float = attrs.field(default=30.0, validator=_non_negative)
    #: Scheduling of the background thread and the OpenMP workers its training starts (Linux,
    #: where a thread has its own): "idle" (SCHED_IDLE: it runs only on CPU time no other thread
    #: wants), or a niceness 1-19, or 0 (serving's priority). A run that goes beside serving then
    #: leaves serving its throughput and learning slows under load instead. Niceness 19 (the
    #: default until 2026-11-28's fourth session) still cost float32 serving 0.79-0.85x.
    background_priority: str | int = attrs.field(
        default="idle", validator=accepts('"idle" or a niceness in [0, 19]',
                                          lambda v: v == "idle" or (is_int(v) and 0 <= v <= 19)))
    #: EWC++: penalty strength (0 disables it), Fisher decay, sequences per Fisher estimate.
    #: "auto": :data:`AUTO_EWC_LAMBDA` for the training dtype, each chosen on sona_dev.py's topics
    #: and texts in that dtype by one rule (the most learning whose forgetting stays within the
    #: budget; docs/sona.md): float32 training forgets less at a given strength, so it can take a
    #: weaker penalty and learn more.
    ewc_lambda: float | str = attrs.field(
        default="auto", validator=any_of(one_of(("auto",)), _non_negative))
    fisher_decay: float = attrs.field(default=0.9, validator=_unit_interval)
    fisher_batch: int = attrs.field(default=2, validator=positive_int())
    #: Deep loop: run after this many feedbacks (0: only on demand), base LoRA rank, patterns.
    deep_every: int = attrs.field(default=32, validator=int_range(0))
    base_rank: int = attrs.field(default=8, validator=positive_int())
    max_patterns: int = attrs.field(default=4, validator=positive_int())
    route_threshold: float = attrs.field(default=0.85, validator=_unit_interval)
    #: Trajectories kept for learning (oldest dropped).
    capacity: int = attrs.field(default=4096, validator=positive_int())
    #: Where ``save`` writes PEFT directories by default.
    save_dir: str | None = None
    seed: int = attrs.field(default=0, validator=accepts("an integer", is_int))

    def ewc_strength(self, training_dtype: torch.dtype) -> float:
        """The EWC++ lambda a learner training in ``training_dtype`` uses."""
        if self.ewc_lambda != "auto":
            return float(self.ewc_lambda)
        return AUTO_EWC_LAMBDA.get(training_dtype, AUTO_EWC_LAMBDA[torch.bfloat16])

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any] | None) -> SonaOptions:
        """From the ``[sona]`` table; unknown keys are an error listing the known ones."""
        return parse_table(cls, values or {})
