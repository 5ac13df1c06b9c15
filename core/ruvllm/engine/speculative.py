"""Speculative decoding's policy: who drafts how many tokens this step.

A drafted request runs ``[last token, d1 .. dk]`` in the step's one forward pass, with logits at
every position (``BatchEntry.all_logits``); the executor core then samples each position in
turn with the request's own sampler and keeps drafts while they equal what was sampled (see
:meth:`ruvllm.engine.executor_core.ExecutorCore._verify`). This module decides ``k``.

The ``i``-th drafted token is kept with probability about ``a ** i``, ``a`` being the draft's
per-token acceptance, and costs what one more token adds to the step (:class:`StepCostModel`,
learnt from the steps run, relative to the step's time per token). A request drafts the tokens
whose chance of being kept exceeds their cost: many on text that copies its input on a
weights-bound executor, few or none on free text or where extra tokens are expensive.

``a`` is estimated from kept tokens against first rejections, with forgetting, per request and
engine-wide per length of the matched tail: a tail of ``prompt_lookup_max`` tokens found earlier
(a copy in progress) predicts far better than a common pair of tokens, and the engine-wide
figure for that length is what a new request starts from. A request that drafts nothing probes
with one token every ``PROBE_INTERVAL`` steps, so one that starts quoting later is noticed.
Above ``disable_by_batch_size`` running requests (vLLM's ``speculative_disable_by_batch_size``)
nobody drafts: the step is then compute-bound.
"""

from __future__ import annotations

import math

import attrs

from ruvllm.engine.ngram import PromptLookup
from ruvllm.engine.request import SchedRequest
from ruvllm.engine.step_cost import StepCostModel

#: Weight kept by older drafts at each new one.
ACCEPTANCE_DECAY = 0.95
#: Weight of the engine-wide estimate (for the tail's match length) in a request's estimate, in
#: drafts: a request's own drafts outweigh it after a few.
PRIOR_WEIGHT = 2.0
#: Steps between one-token probes of a request that drafts nothing.
PROBE_INTERVAL = 32


@attrs.define
class Acceptance:
    """Kept drafted tokens against drafts cut short by a rejection, with forgetting."""

    kept: float = 0.0
    rejected: float = 0.0

    def add(self, drafted: int, accepted: int) -> None:
        self.kept = ACCEPTANCE_DECAY * self.kept + accepted
        self.rejected = ACCEPTANCE_DECAY * self.rejected + (accepted < drafted)

    def rate(self, prior: float, weight: float) -> float:
        """Per-token acceptance, with ``weight`` drafts' worth of ``prior`` mixed in."""
        return (self.kept + weight * prior) / (self.kept + self.rejected + weight)


@attrs.define
class _DraftState:
    lookup: PromptLookup
    acceptance: Acceptance = attrs.field(factory=Acceptance)
    #: Match length of the draft being verified (whose outcome :meth:`Speculator.record` gets).
    match: int = 0
    #: Steps since the request last drafted.
    idle: int = 0


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
        #: Engine-wide acceptance by match length.
        self._by_match = {n: Acceptance() for n in range(prompt_lookup_min, prompt_lookup_max + 1)}
        self._states: dict[str, _DraftState] = {}

    def propose(self, req: SchedRequest, limit: int, batch_size: int) -> tuple[int, ...]:
        """Drafted tokens to verify after ``req``'s last token (at most ``limit``)."""
        if batch_size > self.disable_by_batch_size or limit < 1:
            return ()
        state = self._states.get(req.request_id)
        if state is None:
            state = self._states[req.request_id] = _DraftState(PromptLookup(self.min_n, self.max_n))
        drafts, state.match = state.lookup.propose(req.token_ids, min(self.max_length, limit))
        if not drafts or not self.adaptive:
            return drafts
        k = self._length(self.acceptance(state), self.cost.token_cost(batch_size))
        if k == 0:
            state.idle += 1
            if state.idle < PROBE_INTERVAL:
                return ()
            k = 1
        state.idle = 0
        return drafts[:k]

    def acceptance(self, state: _DraftState) -> float:
        """The request's per-token acceptance, starting from the engine's for its match length
        (itself starting from 1/2); always below 1."""
        prior = self._by_match[state.match].rate(0.5, PRIOR_WEIGHT)
        return state.acceptance.rate(prior, PRIOR_WEIGHT)

    def _length(self, acceptance: float, cost: float) -> int:
        """The most tokens whose chance of being kept, ``acceptance ** i``, exceeds ``cost``."""
        if cost <= 0.0:
            return self.max_length
        return max(0, min(int(math.log(cost) / math.log(acceptance)), self.max_length))

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        """``accepted`` of the ``drafted`` tokens proposed for ``request_id`` were kept."""
        state = self._states.get(request_id)
        if state is None:
            return
        state.acceptance.add(drafted, accepted)
        self._by_match[state.match].add(drafted, accepted)

    def forget(self, request_id: str) -> None:
        self._states.pop(request_id, None)
