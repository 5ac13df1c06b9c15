"""The one sampler: every backend that exposes logits samples through it.

Keeping sampling in core means greedy, seeded sampling, penalties and logprobs behave the same
on every engine, and an engine only has to produce logits. NumPy on one logits row costs well
under a millisecond for a 50k vocabulary, even with nucleus sampling, because the nucleus is
looked for among the top candidates first and the full sort only happens when it is wider.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence

import numpy as np

from ruvllm import dry, llama_samplers
from ruvllm.errors import InvalidRequest
from ruvllm.infill_sampling import InfillFilter
from ruvllm.types import GREEDY_TEMPERATURE, GenerationParams, SampledToken

_NUCLEUS_PROBE = 1024

#: ``processor(output_ids, logits) -> logits``: rewrites one request's logits row before the
#: sampler chooses (vLLM's per-request logits processors). ``output_ids`` are the tokens this
#: request has generated so far; the row returned must keep the vocabulary's length. Reported
#: logprobs stay the model's own: processors steer the choice, they do not change what the
#: model said.
LogitsProcessor = Callable[[Sequence[int], np.ndarray], np.ndarray]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max()
    return shifted - np.log(np.exp(shifted).sum())


class Sampler:
    """Chooses the next token of one request from its logits row.

    Holds the request's random generator (seeded when ``params.seed`` is set) and the token
    counts the penalties need, so one instance serves exactly one request.
    """

    def __init__(self, params: GenerationParams, vocab_size: int, prompt_ids: Sequence[int] = (),
                 logits_processors: Sequence[LogitsProcessor] = (), *,
                 end_ids: Collection[int] | None = None,
                 token_bytes: Callable[[int], bytes] | None = None,
                 dry_breakers: Callable[[], dry.Breakers] | None = None):
        """``end_ids``: the tokens that would end the request (generation.ending_ids), kept out
        until ``params.min_tokens`` tokens are chosen; a caller that cannot say refuses min_tokens.
        ``token_bytes``: a token's text, which ``params.infill_sampling`` compares; with
        ``end_ids`` it is needed for that sampler, which a caller without them refuses.
        ``dry_breakers``: DRY's restart sequences (ruvllm.dry.restart_sequences), asked for when
        the sampler first draws."""
        self.params = params
        on = [name for name in params.llama_cpp_samplers if name not in ("mirostat", "dry_multiplier")]
        if on and not params.temperature_last:
            raise InvalidRequest(on[0], "is one of llama.cpp's samplers, which run in llama.cpp's order only "
                                 "(temperature last: llama-server's default chain); leave it out or put "
                                 "temperature after the filters")
        #: DRY's restart sequences (ruvllm.dry), found at the first draw: on the engine's model
        #: thread, which owns the tokenizer, not on the caller's (the server's event loop).
        self._dry = dry_breakers if params.dry_multiplier > 0 else None
        if params.dry_multiplier > 0 and dry_breakers is None:
            raise InvalidRequest("dry_multiplier", "this backend does not give core's sampler the "
                                 "model's tokenizer, which DRY's sequence breakers need; leave it out or "
                                 "serve the model through the engine")
        #: Mirostat's state (it replaces the filters; llama.cpp's rule, ruvllm.llama_samplers).
        self._mirostat = llama_samplers.Mirostat(params.mirostat, params.mirostat_tau, params.mirostat_eta,
                                                 vocab_size) if params.mirostat else None
        self._infill: InfillFilter | None = None
        if params.infill_sampling:
            if end_ids is None or token_bytes is None:
                raise InvalidRequest("infill_sampling", "this backend does not give core's sampler the "
                                     "tokens that end a request and their texts, which the infill sampler "
                                     "compares; leave it out or serve the model through the engine")
            self._infill = InfillFilter(end_ids, token_bytes)
        self._end_ids = None
        if params.min_tokens:
            if end_ids is None:
                raise InvalidRequest("min_tokens", "this backend does not tell core's sampler which tokens "
                                     "end a request (sample_stream's tokenizer), so min_tokens cannot be "
                                     "honoured; drop min_tokens or serve the model through the engine")
            self._end_ids = np.asarray(sorted(end_ids), dtype=np.int64)
        self._rng = np.random.default_rng(params.seed)
        self._processors = tuple(logits_processors)
        self._output: list[int] = []
        self._counts: np.ndarray | None = None
        self._seen: np.ndarray | None = None
        self._bias_ids: np.ndarray | None = None
        self._bias: np.ndarray | None = None
        #: vLLM's allowed_token_ids: every other token is kept out.
        self._allowed = np.asarray(sorted(set(params.allowed_token_ids)), dtype=np.int64) \
            if params.allowed_token_ids else None
        #: vLLM's bad_words: prefix (the tokens before the last) -> the last tokens it bans.
        self._banned: dict[tuple[int, ...], list[int]] = {}
        for seq in params.banned_sequences:
            self._banned.setdefault(seq[:-1], []).append(seq[-1])
        if params.logit_bias:
            ids, bias = zip(*params.logit_bias, strict=True)
            self._bias_ids = np.asarray(ids, dtype=np.int64)
            self._bias = np.asarray(bias, dtype=np.float32)
        #: llama.cpp's penalty window (params.penalty_last_n; -1: all), where its penalties run.
        self._window: int | None = None
        window = params.penalty_last_n
        if params.has_penalties and window is None:
            self._counts = np.zeros(vocab_size, dtype=np.int32)
            self._seen = np.zeros(vocab_size, dtype=bool)
            ids = np.asarray([t for t in prompt_ids if 0 <= t < vocab_size], dtype=np.int64)
            self._seen[ids] = True
        elif params.has_penalties and window != 0:
            self._window = window
        #: The prompt and the output so far, which the penalty window and DRY read back.
        self._context = list(prompt_ids) if self._window is not None or self._dry is not None else None

    @property
    def processors(self) -> tuple[LogitsProcessor, ...]:
        """This request's logits processors (the engine starts grammar masks from them)."""
        return self._processors

    @property
    def output_ids(self) -> list[int]:
        """Tokens chosen so far (read-only by convention)."""
        return self._output

    def sample(self, logits: np.ndarray) -> SampledToken:
        """Pick a token from a 1-D logits row (any float dtype) and record it."""
        raw = np.asarray(logits, dtype=np.float32)
        p = self.params
        scores = raw
        if self._bias_ids is not None:
            # OpenAI's logit_bias: added to the model's logits before everything else.
            scores = raw.copy()
            scores[self._bias_ids] += self._bias
        for processor in self._processors:
            # A copy per processor: a processor may write in place, the model's row stays intact.
            scores = np.asarray(processor(tuple(self._output), scores.copy()), dtype=np.float32)
        if self._end_ids is not None and len(self._output) < p.min_tokens:
            scores = _without(scores, self._end_ids)
        if self._allowed is not None:
            scores = _only(scores, self._allowed)
        if self._banned:
            scores = _without(scores, self._banned_now())
        if self._counts is not None:
            scores = self._penalised(scores)
        elif self._window is not None:
            scores = self._penalised_in_window(scores)
        if self._dry is not None:
            scores = dry.penalised(scores, self._context, self._dry(), multiplier=p.dry_multiplier,
                                   base=p.dry_base, allowed_length=p.dry_allowed_length,
                                   last_n=p.dry_penalty_last_n)
        if self._mirostat is not None:
            token = self._mirostat.choose(scores, p.temperature, float(self._rng.random()))
        elif p.greedy and self._infill is None:
            token = int(np.argmax(scores))
        elif p.greedy or p.temperature_last:
            # Greedy: the most probable token the infill rule keeps. Temperature last: the filters
            # choose on the model's own scores, the draw reshapes what they kept.
            token = self._draw(scores)
        else:
            with np.errstate(over="ignore"):
                token = self._draw(_finite_top(scores / np.float32(p.temperature)))
        self._record(token)
        return self._with_logprobs(token, raw)

    def _banned_now(self) -> np.ndarray:
        """The tokens that would complete a banned sequence after the output so far."""
        out = self._output
        banned = [t for prefix, last in self._banned.items()
                  if len(prefix) <= len(out) and tuple(out[len(out) - len(prefix):]) == prefix for t in last]
        return np.asarray(banned, dtype=np.int64)

    def _penalised(self, scores: np.ndarray) -> np.ndarray:
        p = self.params
        assert self._counts is not None and self._seen is not None
        scores = scores.copy()
        vocab = min(len(scores), len(self._counts))
        if p.repetition_penalty != 1.0:
            seen = np.flatnonzero(self._seen[:vocab])
            scores[seen] = _repeat_penalised(scores[seen], p.repetition_penalty)
        if p.frequency_penalty or p.presence_penalty:
            # Only generated tokens are penalised: touch those, not the whole row.
            generated = np.flatnonzero(self._counts[:vocab])
            penalty = p.frequency_penalty * self._counts[generated] + p.presence_penalty
            scores[generated] -= penalty.astype(np.float32)
        return scores

    def _penalised_in_window(self, scores: np.ndarray) -> np.ndarray:
        """llama.cpp's penalties over the window's counts: a token seen ``count`` times has its
        logit divided by the repetition penalty (multiplied where not positive), then lowered by
        ``count * frequency_penalty + presence_penalty``; prompt tokens count as output ones."""
        assert self._window is not None and self._context is not None
        p = self.params
        window = self._context if self._window == -1 else self._context[-self._window:]
        if not window:
            return scores
        ids, counts = np.unique(np.asarray(window, dtype=np.int64), return_counts=True)
        inside = (ids >= 0) & (ids < len(scores))
        ids, counts = ids[inside], counts[inside]
        scores = scores.copy()
        scores[ids] = (_repeat_penalised(scores[ids], p.repetition_penalty)
                       - (counts * p.frequency_penalty + p.presence_penalty).astype(np.float32))
        return scores

    def _draw(self, scores: np.ndarray) -> int:
        p = self.params
        if p.top_n_sigma > 0:
            scores = llama_samplers.top_n_sigma(scores, p.top_n_sigma)
        if p.top_k and p.top_k < len(scores):
            candidates = np.argpartition(scores, -p.top_k)[-p.top_k :]
        else:
            candidates = None
        cand_scores = scores if candidates is None else scores[candidates]
        probs = np.exp(cand_scores - cand_scores.max())
        if p.temperature_last and not p.greedy:
            return self._draw_temperature_last(candidates, probs)
        if p.min_p > 0.0:
            # The best candidate has probability weight exp(0) = 1 after the shift above.
            probs[probs < p.min_p] = 0.0
        if self._infill is not None:
            return self._infill_draw(candidates, probs)
        # ``order`` maps positions in the cdf back to candidate positions (None: identity).
        order = None
        u = self._rng.random()
        if p.top_p < 1.0:
            order, cdf = _nucleus(probs, p.top_p)
            idx = int(order[_search_cdf(cdf, u, order_probs=probs[order])])
        else:
            idx = _draw_index(probs, u)
        return int(idx if candidates is None else candidates[idx])

    def _draw_temperature_last(self, candidates: np.ndarray | None, probs: np.ndarray) -> int:
        """llama.cpp's order: top-p, then min-p on the model's own probabilities of the top-k
        candidates (``probs``, the best at 1), then the temperature over what they kept:
        ``exp(logit / T)`` is the kept probability to the power ``1 / T``, so the weights are
        ``probs ** (1 / T)`` over the kept tokens (the infill rule, where on, between the two)."""
        p = self.params
        if p.typical_p < 1.0:  # llama.cpp's typical runs between top-k and top-p
            typical = llama_samplers.typical(probs, p.typical_p)
            kept = typical[_kept(probs[typical], p.top_p)]
        else:
            kept = _kept(probs, p.top_p)
        if p.min_p > 0.0:
            kept = kept[probs[kept] >= p.min_p * probs[kept].max()]
        if p.xtc_probability > 0.0:
            chance = float(self._rng.random())
            kept = llama_samplers.xtc(kept, probs, p.xtc_threshold, chance, p.xtc_probability)
        ids = kept if candidates is None else candidates[kept]
        weights = probs[kept]
        if self._infill is not None:
            ids, weights = self._infill(ids, weights)
        temperature = llama_samplers.dynamic_temperature(weights, p.temperature, p.dynatemp_range,
                                                         p.dynatemp_exponent)
        if temperature < GREEDY_TEMPERATURE:
            return int(ids[np.argmax(weights)])
        with np.errstate(under="ignore"):
            weights = weights ** (1.0 / temperature)
        return int(ids[_draw_index(weights, self._rng.random())])

    def _infill_draw(self, candidates: np.ndarray | None, probs: np.ndarray) -> int:
        """A draw among what top-k, min-p and top-p kept, after the infill sampler's rule."""
        assert self._infill is not None
        kept = _kept(probs, self.params.top_p)
        ids, weights = self._infill(kept if candidates is None else candidates[kept], probs[kept])
        if self.params.greedy:
            return int(ids[np.argmax(weights)])
        return int(ids[_draw_index(weights, self._rng.random())])

    def _record(self, token: int) -> None:
        self._output.append(token)
        if self._context is not None:
            self._context.append(token)
        if self._counts is not None and token < len(self._counts):
            self._counts[token] += 1
            assert self._seen is not None
            self._seen[token] = True

    def _with_logprobs(self, token: int, raw: np.ndarray) -> SampledToken:
        n = self.params.logprobs
        if n is None:
            return SampledToken(token_id=token)
        lp = log_softmax(raw)
        return SampledToken(token_id=token, logprob=float(lp[token]), top_logprobs=top_logprobs(lp, n))


def _without(scores: np.ndarray, banned: np.ndarray) -> np.ndarray:
    """``scores`` with ``banned`` at -inf, unless nothing else is left: a grammar that allows
    only the end (its answer is complete) still ends the request."""
    kept = scores.copy()
    kept[banned[banned < len(kept)]] = -np.inf
    return kept if np.isfinite(kept).any() else scores


def _repeat_penalised(vals: np.ndarray, penalty: float) -> np.ndarray:
    """The repetition penalty's rule (vLLM's and llama.cpp's): a positive logit divided by it,
    any other multiplied (a tiny penalty overflows to +inf, which the draw caps)."""
    with np.errstate(over="ignore", divide="ignore"):
        return np.where(vals > 0, vals / np.float32(penalty), vals * np.float32(penalty))


def _only(scores: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """``scores`` with every token but ``allowed`` at -inf, unless that leaves nothing (a
    grammar that allows none of them keeps its own choice, as :func:`_without` does)."""
    kept = np.full_like(scores, -np.inf)
    ids = allowed[allowed < len(scores)]
    kept[ids] = scores[ids]
    return kept if np.isfinite(kept).any() else scores


def _finite_top(scores: np.ndarray) -> np.ndarray:
    """``scores`` with +inf lowered to the largest float32: a tiny temperature or repetition
    penalty overflows the best scores to +inf, and ``inf - inf`` would turn the distribution into
    NaN. Capped, those tokens share the mass, as their overwhelming scores mean."""
    if np.isposinf(scores).any():
        return np.minimum(scores, np.finfo(np.float32).max)
    return scores


def top_logprobs(lp: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The ``n`` best ``(token id, logprob)`` pairs of a logprob row, best first.

    Equal logprobs are listed lowest token id first, the token greedy decoding's argmax picks: a
    bf16 model's row ties often, and a greedy token that is not ``top_logprobs[0]`` reads as a bug
    to every client (the conformance suite checks it)."""
    # A vocabulary smaller than the request (tiny test models) reports every token.
    n = min(n, len(lp))
    if n <= 0:
        return ()
    kth = lp[np.argpartition(lp, -n)[-n:]].min()
    # Every token tied with the n-th best competes for the last places, not an arbitrary subset.
    tied = np.flatnonzero(lp >= kth)
    best = tied[np.lexsort((tied, -lp[tied]))][:n]
    return tuple((int(i), float(lp[i])) for i in best)


_BLOCK = 512


def _search_cdf(cdf: np.ndarray, u: float, order_probs: np.ndarray) -> int:
    """Inverse-CDF lookup: the first index whose cumulative mass exceeds ``u`` of the total,
    never landing on a zero-probability entry when rounding puts the target at the very end."""
    idx = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    if idx >= len(cdf):
        idx = int(np.flatnonzero(order_probs)[-1])
    return idx


def _draw_index(probs: np.ndarray, u: float) -> int:
    """Index drawn from unnormalised ``probs`` by inverse-CDF sampling with the uniform ``u``.

    A running sum over a 50k row costs ~10x a vectorised sum, so long rows go in two levels:
    the cumulative sum of 512-wide block sums picks the block, then one block is scanned.
    The result is the same token the flat cumulative sum would give (up to float rounding).
    """
    n = len(probs)
    if n <= 4 * _BLOCK:
        return _search_cdf(np.cumsum(probs, dtype=np.float64), u, probs)
    blocks = -(-n // _BLOCK)
    padded = probs if n == blocks * _BLOCK else np.concatenate(
        [probs, np.zeros(blocks * _BLOCK - n, dtype=probs.dtype)]
    )
    sums = padded.reshape(blocks, _BLOCK).sum(axis=1, dtype=np.float64)
    block_cdf = np.cumsum(sums)
    b = _search_cdf(block_cdf, u, sums)
    rest = u * block_cdf[-1] - (block_cdf[b - 1] if b else 0.0)
    chunk = padded[b * _BLOCK : (b + 1) * _BLOCK]
    inner = np.cumsum(chunk, dtype=np.float64)
    i = int(np.searchsorted(inner, rest, side="right"))
    if i >= _BLOCK or chunk[i] == 0.0:
        # Rounding between the two levels overshot the block: take its last possible token.
        i = int(np.flatnonzero(chunk)[-1])
    return b * _BLOCK + i


def _kept(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Indices of the tokens top-p keeps among ``probs`` (every token of non-zero weight at 1)."""
    return _nucleus(probs, top_p)[0] if top_p < 1.0 else np.flatnonzero(probs)


def _nucleus(probs: np.ndarray, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The smallest set of tokens whose probability mass reaches ``top_p``.

    Returns their indices in ``probs`` (which may be unnormalised), most probable first, and
    the cumulative distribution over them, which the draw reuses. Real next-token distributions
    put that mass on a few tokens, so the set is looked for among the tokens close to the best
    one, then the top 1024 and the top 8192 candidates (a partial partition each); the whole
    vocabulary is sorted only when the nucleus is wider still (a nearly flat distribution).
    """
    # float64 sums: a float32 running sum over ~50k small probabilities drifts by ~1e-3, which
    # moves the nucleus boundary by dozens of tokens.
    total = float(probs.sum(dtype=np.float64))
    n = len(probs)
    # Cheapest first: every token within 1/1000 of the best one (a threshold, no partition).
    # Those tokens are a prefix of the sorted order, so if they reach top_p the nucleus is
    # among them.
    head = np.flatnonzero(probs >= probs.max() * 1e-3)
    if len(head) <= _NUCLEUS_PROBE:
        head = head[np.argsort(-probs[head])]
        cum = np.cumsum(probs[head], dtype=np.float64) / total
    if len(head) > _NUCLEUS_PROBE or cum[-1] < top_p:
        for probe in (_NUCLEUS_PROBE, 8 * _NUCLEUS_PROBE, n):
            probe = min(probe, n)
            head = np.argpartition(probs, -probe)[-probe:] if probe < n else np.arange(n)
            head = head[np.argsort(-probs[head])]
            cum = np.cumsum(probs[head], dtype=np.float64) / total
            if cum[-1] >= top_p or probe == n:
                break
    keep = min(int(np.searchsorted(cum, top_p)) + 1, len(head))
    return head[:keep], cum[:keep]
