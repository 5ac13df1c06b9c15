"""ServingEngine options (the ``[engine]`` table of ruvllm.toml), validated on construction.

Validated with core's one option helper (:mod:`ruvllm.options`), as backends' and plugins'
tables are: a bad value is an :class:`~ruvllm.errors.EngineOptionError` naming ``engine.<option>``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

from ruvllm.engine.scheduler import Policy, SchedulerConfig
from ruvllm.engine.speculative import Speculator
from ruvllm.errors import EngineOptionError
from ruvllm.guided.engine import DEFAULT_ENGINE, engine_option
from ruvllm.options import (
    accepts,
    boolean,
    float_range,
    int_range,
    is_int,
    one_of,
    option_error,
    optional,
    parse_table,
    positive_int,
)

if TYPE_CHECKING:
    from ruvllm.engine.draft_model import DraftModel

PATHS = ("auto", "executor", "request")
_NAME = accepts("a non-empty string", lambda v: isinstance(v, str) and bool(v))
#: ``speculative_method`` values (vLLM's ``speculative_config.method`` names).
SPECULATIVE_METHODS = ("none", "ngram", "draft_model")
#: vLLM's ``--speculative-config`` keys -> the ``[engine]`` options they set.
SPECULATIVE_CONFIG_KEYS = {
    "method": "speculative_method",
    "model": "speculative_model",
    "draft_backend": "speculative_draft_backend",
    "num_speculative_tokens": "num_speculative_tokens",
    "prompt_lookup_min": "prompt_lookup_min",
    "prompt_lookup_max": "prompt_lookup_max",
    "disable_by_batch_size": "speculative_disable_by_batch_size",
    "adaptive": "speculative_adaptive",
}


def speculative_config_options(text: str) -> dict[str, Any]:
    """``[engine]`` options from a vLLM-style ``--speculative-config`` JSON object, e.g.
    ``{"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_max": 4}``. The values are
    validated when the options are built; unknown keys are refused here, by name."""
    try:
        given = json.loads(text)
    except json.JSONDecodeError as exc:
        raise EngineOptionError("speculative_config", f"must be a JSON object: {exc}", text) from None
    if not isinstance(given, dict):
        raise EngineOptionError("speculative_config", "must be a JSON object", text)
    unknown = sorted(set(given) - set(SPECULATIVE_CONFIG_KEYS))
    if unknown:
        raise EngineOptionError("speculative_config", f"unknown key(s) {', '.join(unknown)}; known: "
                                f"{', '.join(SPECULATIVE_CONFIG_KEYS)}", text)
    return {SPECULATIVE_CONFIG_KEYS[k]: v for k, v in given.items()}


def _policy(value: Any) -> Any:
    """A Policy from its name; anything else is left for the validator to refuse."""
    try:
        return Policy(value)
    except (ValueError, TypeError):
        return value


def _seconds(*, allow_none: bool = False) -> Any:
    check = float_range(0, low_open=True, note="seconds")
    return optional(check) if allow_none else check


@attrs.frozen(kw_only=True)
class EngineOptions:
    TABLE: ClassVar[str] = "engine"

    #: Most requests running (holding KV) at once; also the executor's sequence count.
    max_num_seqs: int = attrs.field(default=16, validator=positive_int())
    #: Most tokens per forward pass (prefill chunks + decode tokens).
    max_batch_tokens: int = attrs.field(default=512, validator=positive_int())
    #: Tokens per KV block.
    block_size: int = attrs.field(default=16, validator=positive_int())
    #: KV capacity in blocks; None = what the executor offers.
    num_blocks: int | None = attrs.field(default=None, validator=optional(positive_int()))
    policy: Policy = attrs.field(default=Policy.FCFS, converter=_policy, validator=one_of(tuple(Policy)))
    #: Seconds of waiting worth one priority level (see docs/engine.md, "aging").
    aging_interval: float = attrs.field(default=5.0, validator=_seconds())
    #: Largest prefill chunk of one request per step (0 = no cap beyond the batch budget).
    max_prefill_chunk: int = attrs.field(default=0, validator=int_range(0))
    #: Requests accepted but not yet running; one more is rejected with ``Overloaded``.
    max_queue: int = attrs.field(default=256, validator=positive_int())
    #: Default per-request deadline in seconds from submission (None = no deadline).
    request_timeout: float | None = attrs.field(default=None, validator=_seconds(allow_none=True))
    enable_prefix_caching: bool = attrs.field(default=True, validator=boolean())
    #: Per-sequence executors (llama.cpp, MLX): extra sequences that keep finished requests'
    #: cached prefixes alive for later hits, one prefix each. Their blocks count in the pool and
    #: are evicted, least recently used, when running requests need them, so the pool's size
    #: bounds their memory and this bounds how many prompts stay cached. "auto": the backend's
    #: own count (``LlmBackend.prefix_donor_slots``): 64 on llama.cpp, whose donors wait in host
    #: memory within a 256 MiB pool, 16 elsewhere (MLX keeps them in its 2 GiB pool, where 64
    #: took a server from 1.5 to 3.1 GiB after 72 prompts); docs/engine.md "Parked prefixes".
    prefix_donor_slots: int | str = attrs.field(
        default="auto", validator=accepts('"auto" or an integer >= 0',
                                          lambda v: v == "auto" or (is_int(v) and v >= 0)))
    #: Fraction of KV blocks kept free when admitting a new request.
    watermark: float = attrs.field(default=0.01, validator=float_range(0, 1, high_open=True))
    #: Request-level path: most backend ``generate`` streams interleaved at once (1 when the
    #: backend does not declare ``concurrent_requests``).
    max_in_flight: int = attrs.field(default=8, validator=positive_int())
    #: "auto" (executor when the backend has one), "executor" or "request".
    path: str = attrs.field(default="auto", validator=one_of(PATHS))
    #: Grammar engine of constrained decoding (vLLM's name): "llguidance" or "xgrammar"
    #: (docs/structured-output.md); the library is imported on the first constrained request.
    guided_decoding_backend: str = attrs.field(default=DEFAULT_ENGINE, validator=engine_option())
    #: Speculative decoding (docs/engine.md, "Speculative decoding"): "none", "ngram" (prompt
    #: lookup over the request's prompt + output) or "draft_model" (a smaller model of the same
    #: vocabulary, ``speculative_model``). Off by default: it pays on input-grounded work (ngram)
    #: or with a draft much cheaper than the target, and costs a little elsewhere.
    speculative_method: str = attrs.field(default="none", validator=one_of(SPECULATIVE_METHODS))
    #: The draft model of ``draft_model`` (a path or model reference, as ``--model``).
    speculative_model: str | None = attrs.field(default=None, validator=optional(_NAME))
    #: Backend the draft model runs on (None: the target's).
    speculative_draft_backend: str | None = attrs.field(default=None, validator=optional(_NAME))
    #: Most tokens drafted per request per step (the adaptive length never exceeds it).
    num_speculative_tokens: int = attrs.field(default=10, validator=int_range(1, 32))
    #: Shortest and longest n-gram of the request's tail looked up earlier in it.
    prompt_lookup_min: int = attrs.field(default=2, validator=positive_int())
    prompt_lookup_max: int = attrs.field(default=4, validator=positive_int())
    #: No drafts in a step with more running requests than this (the batch keeps the CPU busy).
    speculative_disable_by_batch_size: int = attrs.field(default=4, validator=positive_int())
    #: Draft length per request from its acceptance rate and what a drafted token costs (false:
    #: always ``num_speculative_tokens``, as vLLM).
    speculative_adaptive: bool = attrs.field(default=True, validator=boolean())
    #: A greedy or seeded request's tokens and logprobs do not depend on what runs beside it
    #: (batch size, order, prefix-cache hits, prefill chunks, preemption); docs/engine.md,
    #: "Batch-invariant mode". Backends that cannot hold it refuse it by name.
    batch_invariant: bool = attrs.field(default=False, validator=boolean())

    def __attrs_post_init__(self) -> None:
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise option_error(self, "prompt_lookup_min", f"must be <= prompt_lookup_max "
                               f"({self.prompt_lookup_max})", self.prompt_lookup_min)
        if self.speculative_method == "draft_model" and not self.speculative_model:
            raise option_error(self, "speculative_model", 'is required by speculative_method = "draft_model" '
                               "(the draft model's path or name)", self.speculative_model)

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> EngineOptions:
        """From the ``[engine]`` table; unknown keys are an error listing the known ones."""
        return parse_table(cls, values)

    def speculator(self, draft: DraftModel | None = None) -> Speculator:
        """The drafts' policy these options ask for; ``draft`` is the loaded draft model of
        ``draft_model``. With ``none`` only requests with a predicted output draft."""
        if self.speculative_method == "draft_model":
            from ruvllm.engine.draft_model import DraftModelSpeculator

            if draft is None:
                raise ValueError('speculative_method = "draft_model" needs the loaded draft model')
            return DraftModelSpeculator(draft, num_speculative_tokens=self.num_speculative_tokens,
                                        disable_by_batch_size=self.speculative_disable_by_batch_size,
                                        adaptive=self.speculative_adaptive)
        return Speculator(num_speculative_tokens=self.num_speculative_tokens,
                          prompt_lookup_min=self.prompt_lookup_min, prompt_lookup_max=self.prompt_lookup_max,
                          disable_by_batch_size=self.speculative_disable_by_batch_size,
                          adaptive=self.speculative_adaptive, lookup=self.speculative_method == "ngram")

    def donor_slots(self, backend_default: int, limit: int | None = None) -> int:
        """``prefix_donor_slots`` for a backend whose own count is ``backend_default`` and whose
        executor holds at most ``limit`` sequences: "auto" takes what fits beside
        ``max_num_seqs``; a number is taken as given (the executor refuses too many by name)."""
        if self.prefix_donor_slots != "auto":
            return int(self.prefix_donor_slots)
        return backend_default if limit is None else max(0, min(backend_default, limit - self.max_num_seqs))

    def scheduler_config(self, max_num_seqs: int, max_batch_tokens: int,
                         split_prompt_tail: bool = False, split_prompt_tail_rows: int = 0) -> SchedulerConfig:
        return SchedulerConfig(
            max_batch_tokens=max_batch_tokens,
            max_num_seqs=max_num_seqs,
            policy=self.policy,
            aging_interval=self.aging_interval,
            max_prefill_chunk=self.max_prefill_chunk,
            split_prompt_tail=split_prompt_tail,
            split_prompt_tail_rows=split_prompt_tail_rows,
        )
