"""Speculative decoding's policy: who drafts how many tokens this step.

A drafted request runs ``[last token, d1 .. dk]`` in the step's one forward pass, with logits at
every position (``BatchEntry.all_logits``); the executor core then samples each position in
turn with the request's own sampler and keeps drafts while they equal what was sampled (see
:meth:`ruvllm.engine.executor_core.ExecutorCore._verify`). This module decides ``k``.

The ``i``-th drafted token is kept with probability about ``a ** i``, ``a`` being the request's
acceptance rate (estimated from its own drafts: kept tokens against first rejections, with
forgetting), and costs what one more token adds to the step (:class:`StepCostModel`, learnt
from the steps run, relative to the step's time per token). A request therefore drafts the
tokens whose chance of being kept exceeds their cost: many on text that copies its input on a
weights-bound executor, few or none on free text or where extra tokens are expensive. A request
that drafts nothing probes with one token every ``PROBE_INTERVAL`` steps, so a request that
starts quoting its input later is noticed. Above ``disable_by_batch_size`` running requests
(vLLM's ``speculative_disable_by_batch_size``) nobody drafts: the step is then compute-bound.
"""

from __future__ import annotations

import math

import attrs

from ruvllm.engine.ngram import PromptLookup
from ruvllm.engine.request import SchedRequest
from ruvllm.engine.step_cost import StepCostModel

#: Weight kept by a request's older drafts at each new one.
ACCEPTANCE_DECAY = 0.95
#: Steps between one-token probes of a request that drafts nothing.
PROBE_INTERVAL = 32


@attrs.define
class _DraftState:
    lookup: PromptLookup
    #: Drafted tokens kept, and drafts cut short by a rejection (both with forgetting); the
    #: acceptance estimate starts from one of each (1/2).
    kept: float = 1.0
    rejected: float = 1.0
    #: Steps since the request last drafted.
    idle: int = 0

    @property
    def acceptance(self) -> float:
        return self.kept / (self.kept + self.rejected)


class Speculator:
    """Prompt-lookup drafts for the scheduler, sized per request and per step."""

    def __init__(self, *, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int,
                 disable_by_batch_size: int, adaptive: bool = True):
        """``adaptive`` False: every request drafts ``num_speculative_tokens`` whenever its tail
        matches (vLLM's fixed length), whatever its acceptance and the cost."""
        self.adaptive = adaptive
        self.max_length = num_speculative_tokens
        self.min_n = prompt_lookup_min
        self.max_n = prompt_lookup_max
        self.disable_by_batch_size = disable_by_batch_size
        self.cost = StepCostModel()
        self._states: dict[str, _DraftState] = {}

    def propose(self, req: SchedRequest, limit: int, batch_size: int) -> tuple[int, ...]:
        """Drafted tokens to verify after ``req``'s last token (at most ``limit``)."""
        if batch_size > self.disable_by_batch_size or limit < 1:
            return ()
        state = self._states.get(req.request_id)
        if state is None:
            state = self._states[req.request_id] = _DraftState(PromptLookup(self.min_n, self.max_n))
        k = self.max_length
        if self.adaptive:
            k = self._length(state.acceptance, self.cost.token_cost(batch_size))
        if k == 0:
            state.idle += 1
            if state.idle < PROBE_INTERVAL:
                return ()
            k = 1
        drafts = state.lookup.propose(req.token_ids, min(k, limit))
        if drafts:
            state.idle = 0
        return drafts

    def _length(self, acceptance: float, cost: float) -> int:
        """The most tokens whose chance of being kept, ``acceptance ** i``, exceeds ``cost``."""
        if cost <= 0.0:
            return self.max_length
        return min(int(math.log(cost) / math.log(acceptance)), self.max_length)

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        """``accepted`` of the ``drafted`` tokens proposed for ``request_id`` were kept."""
        state = self._states.get(request_id)
        if state is None:
            return
        state.kept = ACCEPTANCE_DECAY * state.kept + accepted
        state.rejected = ACCEPTANCE_DECAY * state.rejected + (accepted < drafted)

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)
