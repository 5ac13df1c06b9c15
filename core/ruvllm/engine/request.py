"""A request as the scheduler sees it: tokens, progress and priority; no model, no asyncio."""

from __future__ import annotations

import enum

import attrs


class Priority(enum.IntEnum):
    """Named priority levels; any int works, and a higher value is served first."""

    LOW = -1
    NORMAL = 0
    HIGH = 1
    CRITICAL = 2


class RequestState(str, enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    #: Preempted by recompute: back in the waiting queue with its output kept.
    PREEMPTED = "preempted"
    FINISHED = "finished"


@attrs.define(eq=False)
class SchedRequest:
    """One request's scheduling state.

    ``token_ids`` is the prompt followed by every token generated so far; ``num_computed`` of
    them have KV in the executor. A decode step runs the one token not yet computed; after a
    preemption ``num_computed`` drops to 0 and the whole of ``token_ids`` is run again as a
    prefill, which reproduces the KV exactly, so the next token is the same as it would have
    been (preemption by recompute).
    """

    request_id: str
    token_ids: list[int]
    max_tokens: int
    priority: int = 0
    arrival: float = 0.0
    #: Admission order, the tie-breaker that keeps ordering total and FCFS stable.
    seq_no: int = 0
    cache_salt: str | None = None
    #: False when every prompt position must run (prompt logprobs need their logits).
    reuse_prefix: bool = True
    #: OpenAI's predicted output as token ids: drafts to verify (ruvllm.engine.prediction).
    prediction: tuple[int, ...] = ()
    #: Its rows run through the executor's batch-invariant kernels (GenerationParams.batch_invariant
    #: on an engine not built in the mode).
    invariant: bool = False
    num_prompt: int = attrs.field(default=-1)
    num_computed: int = 0
    #: Executor sequence id while the request holds KV.
    slot: int | None = None
    state: RequestState = RequestState.WAITING
    #: Prompt tokens found in the prefix cache at the first admission (not after a preemption).
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    first_scheduled: float | None = None

    def __attrs_post_init__(self) -> None:
        if self.num_prompt < 0:
            self.num_prompt = len(self.token_ids)

    @property
    def num_output(self) -> int:
        return len(self.token_ids) - self.num_prompt

    @property
    def num_pending(self) -> int:
        """Tokens that still need a forward pass before the next sample."""
        return len(self.token_ids) - self.num_computed
