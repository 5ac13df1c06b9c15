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
from ruvllm.engine.prediction import PredictionCursor
from ruvllm.engine.request import SchedRequest
from ruvllm.engine.step_cost import StepCostModel

#: Weight kept by older drafts at each new one.
ACCEPTANCE_DECAY = 0.95
#: Weight of the engine-wide estimate (for the tail's match length) in a request's estimate, in
#: drafts: a request's own drafts outweigh it after a few.
PRIOR_WEIGHT = 2.0
#: Steps between one-token probes of a request that drafts nothing.
PROBE_INTERVAL = 32
#: Longest draft from a predicted output in one step: its tokens are kept far more often than
#: an n-gram's, so a step verifies more of them (the acceptance policy still sizes each draft).
MAX_PREDICTED_DRAFT = 16
#: Per-token acceptance a request's predicted output starts from. A client sends one because it
#: expects most of the answer (a file it asks to have edited), and how right it is depends on
#: that client, not on the others: each request starts here, never from the engine's figures,
#: and its own drafts replace this after a few (one client's poor predictions never stop
#: another's from drafting).
PREDICTION_PRIOR = 0.8


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
    #: The request's n-gram index (None when a draft model proposes or a prediction drafts).
    lookup: PromptLookup | None
    acceptance: Acceptance = attrs.field(factory=Acceptance)
    #: Match length of the draft being verified (whose outcome :meth:`Speculator.record` gets).
    match: int = 0
    #: Steps since the request last drafted.
    idle: int = 0
    #: The request's place in its predicted output (OpenAI's ``prediction``), which drafts for it.
    predicted: PredictionCursor | None = None


class Speculator:
    """Prompt-lookup drafts for the scheduler, sized per request and per step; a request with a
    predicted output drafts from it instead (:mod:`ruvllm.engine.prediction`)."""

    #: Per-token acceptance assumed for a request before the engine has seen any drafts.
    prior_acceptance = 0.5

    def __init__(self, *, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int,
                 disable_by_batch_size: int, adaptive: bool = True, lookup: bool = True):
        """``adaptive`` False: every request drafts ``num_speculative_tokens`` whenever its tail
        matches (vLLM's fixed length), whatever its acceptance and the cost. ``lookup`` False:
        only requests with a predicted output draft (``speculative_method = "none"``)."""
        self.adaptive = adaptive
        self.lookup = lookup
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
        if req.prediction:
            return self._predicted(req, limit, batch_size)
        if not self.lookup:
            return ()
        state = self._state(req.request_id, lookup=True)
        assert state.lookup is not None
        drafts, state.match = state.lookup.propose(req.token_ids, min(self.max_length, limit))
        if not drafts or not self.adaptive:
            return drafts
        return drafts[:self._sized(state, self.cost.token_cost(batch_size))]

    def _predicted(self, req: SchedRequest, limit: int, batch_size: int) -> tuple[int, ...]:
        """Drafts from ``req``'s predicted output, sized by their own acceptance (a request
        editing a file keeps most of them; one rewriting it, few)."""
        state = self._states.get(req.request_id)
        if state is None:
            cursor = PredictionCursor(req.prediction, self.min_n, self.max_n)
            state = self._states[req.request_id] = _DraftState(None, predicted=cursor)
        assert state.predicted is not None
        drafts = state.predicted.propose(req.token_ids[req.num_prompt:], min(MAX_PREDICTED_DRAFT, limit))
        if not drafts or not self.adaptive:
            return drafts
        return drafts[:self._sized(state, self.cost.token_cost(batch_size), MAX_PREDICTED_DRAFT)]

    def _state(self, request_id: str, *, lookup: bool) -> _DraftState:
        """``request_id``'s state, created on its first proposal (with an n-gram index if ``lookup``)."""
        state = self._states.get(request_id)
        if state is None:
            index = PromptLookup(self.min_n, self.max_n) if lookup else None
            state = self._states[request_id] = _DraftState(index)
        return state

    def _sized(self, state: _DraftState, cost: float, most: int | None = None) -> int:
        """How many tokens ``state``'s request drafts when each costs ``cost`` (at most ``most``,
        default ``num_speculative_tokens``): 0 while drafting does not pay, except a one-token
        probe every ``PROBE_INTERVAL`` such steps."""
        k = self._length(self.acceptance(state), cost, most or self.max_length)
        if k == 0:
            state.idle += 1
            if state.idle < PROBE_INTERVAL:
                return 0
            k = 1
        state.idle = 0
        return k

    def acceptance(self, state: _DraftState) -> float:
        """The request's per-token acceptance, starting from the engine's for its match length
        (itself starting from ``prior_acceptance``), or from ``PREDICTION_PRIOR`` for a predicted
        output; always below 1."""
        if state.predicted is not None:
            prior = PREDICTION_PRIOR
        else:
            prior = self._by_match[state.match].rate(self.prior_acceptance, PRIOR_WEIGHT)
        return state.acceptance.rate(prior, PRIOR_WEIGHT)

    def _length(self, acceptance: float, cost: float, most: int) -> int:
        """The most tokens (up to ``most``) whose chance of being kept, ``acceptance ** i``,
        exceeds ``cost``."""
        if cost <= 0.0:
            return most
        return max(0, min(int(math.log(cost) / math.log(acceptance)), most))

    def record(self, request_id: str, drafted: int, accepted: int) -> None:
        """``accepted`` of the ``drafted`` tokens proposed for ``request_id`` were kept."""
        state = self._states.get(request_id)
        if state is None:
            return
        state.acceptance.add(drafted, accepted)
        if state.predicted is None:
            self._by_match[state.match].add(drafted, accepted)

    def preempted(self, request_id: str) -> None:
        """``request_id`` lost its KV (it will be prefilled again); its history is unchanged, so
        the n-gram index and acceptance stay."""

    def forget(self, request_id: str) -> None:
        """``request_id`` ended (finished, cancelled, failed)."""
        self._states.pop(request_id, None)

    def close(self) -> None:
        """The engine shuts down (a draft model releases its executor here)."""
