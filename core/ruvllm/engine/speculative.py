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

The same policy sizes a draft model's proposals (:mod:`ruvllm.engine.draft_model`), whose
drafts cost a draft-model step each on top of their verification.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

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
    #: The request's n-gram index (None when a draft model proposes).
    lookup: PromptLookup | None
    acceptance: Acceptance = attrs.field(factory=Acceptance)
    #: Match length of the draft being verified (whose outcome :meth:`Speculator.record` gets).
    match: int = 0
    #: Steps since the request last drafted.
    idle: int = 0


class Speculator:
    """Prompt-lookup drafts for the scheduler, sized per request and per step."""

    #: Per-token acceptance assumed for a request before the engine has seen any drafts.
    prior_acceptance = 0.5

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
        #: Engine-wide acceptance by match length (prompt lookup; 0 for a draft model).
        self._by_match: defaultdict[int, Acceptance] = defaultdict(Acceptance)
        self._states: dict[str, _DraftState] = {}

    def prepare(self, requests: Sequence[SchedRequest], batch_size: int) -> None:
        """Called once per step, before :meth:`propose`, with the running requests that decode
        (a draft model proposes for all of them in batched passes); prompt lookup needs nothing."""

    def propose(self, req: SchedRequest, limit: int, batch_size: int) -> tuple[int, ...]:
        """Drafted tokens to verify after ``req``'s last token (at most ``limit``)."""
        if batch_size > self.disable_by_batch_size or limit < 1:
            return ()
        state = self._state(req.request_id, lookup=True)
        assert state.lookup is not None
        drafts, state.match = state.lookup.propose(req.token_ids, min(self.max_length, limit))
        if not drafts or not self.adaptive:
            return drafts
        return drafts[:self._sized(state, self.cost.token_cost(batch_size))]

    def _state(self, request_id: str, *, lookup: bool) -> _DraftState:
        """``request_id``'s state, created on its first proposal (with an n-gram index if ``lookup``)."""
        state = self._states.get(request_id)
        if state is None:
            index = PromptLookup(self.min_n, self.max_n) if lookup else None
            state = self._states[request_id] = _DraftState(index)
        return state

    def _sized(self, state: _DraftState, cost: float) -> int:
        """How many tokens ``state``'s request drafts when each costs ``cost``: 0 while drafting
        does not pay, except a one-token probe every ``PROBE_INTERVAL`` such steps."""
        k = self._length(self.acceptance(state), cost)
        if k == 0:
            state.idle += 1
            if state.idle < PROBE_INTERVAL:
                return 0
            k = 1
        state.idle = 0
        return k

    def acceptance(self, state: _DraftState) -> float:
        """The request's per-token acceptance, starting from the engine's for its match length
        (itself starting from ``prior_acceptance``); always below 1."""
        prior = self._by_match[state.match].rate(self.prior_acceptance, PRIOR_WEIGHT)
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

    def preempted(self, request_id: str) -> None:
        """``request_id`` lost its KV (it will be prefilled again); its history is unchanged, so
        the n-gram index and acceptance stay."""

    def forget(self, request_id: str) -> None:
        """``request_id`` ended (finished, cancelled, failed)."""
        self._states.pop(request_id, None)

    def close(self) -> None:
        """The engine shuts down (a draft model releases its executor here)."""
