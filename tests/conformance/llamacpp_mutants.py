"""The real llama.cpp backend with one bug injected each, to prove the conformance suite kills it.

Loaded into a child conformance run as ``--ruvllm-backend llamacpp_mutants:ClassName``. Each
mutant is the shipped backend and executor (``ruvllm_llamacpp``) except for the one method that
carries the bug; ``test_mutation_proof.py`` runs each against the suite test(s) that must fail
and docs/conformance.md ("Mutation proof") tabulates them.

Some contract points are enforced by core for every backend (max_tokens, stop strings, EOS,
stream text): core's ``RequestOutputBuilder`` counts tokens, matches stop strings on text and
closes the backend's iterator when the request ends. The mutants for those are the backends that
do part of that work themselves, in the engine underneath, the way third-party backends do
(their own max_tokens count, stop check, EOS bias, sampler settings), and get it wrong.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

import attrs
import numpy as np
from ruvllm.backend import sample_stream
from ruvllm.errors import ContextLengthExceeded
from ruvllm.executor import BatchEntry
from ruvllm.types import GenerationParams, SampledToken
from ruvllm_llamacpp import LlamaCppBackend
from ruvllm_llamacpp.executor import LlamaCppExecutor
from ruvllm_llamacpp.kv import SEQ, SequenceKV
from ruvllm_llamacpp.kv_pool import plan_pool

#: llama.cpp's LLAMA_DEFAULT_SEED, what an engine sampler uses when nobody passes a seed.
ENGINE_DEFAULT_SEED = 0xFFFFFFFF


class _SequenceMutant(LlamaCppBackend):
    """A backend whose request-level sequence (its SequenceKV) is of class ``kv_class``."""

    kv_class: ClassVar[type[SequenceKV]] = SequenceKV

    def _sequence(self) -> SequenceKV:
        kv = super()._sequence()
        if type(kv) is not self.kv_class:
            kv.__class__ = self.kv_class
            self._configure(kv)
        return kv

    def _configure(self, kv: Any) -> None:
        return None


class _EngineLoop(LlamaCppBackend):
    """A backend whose generate() post-processes the real token stream (``_engine``)."""

    def _run(self, prompt: list[int], params: GenerationParams) -> Iterator[SampledToken]:
        tokens = super()._run(prompt, params)
        try:
            yield from self._engine(tokens, params)
        finally:
            tokens.close()

    @abc.abstractmethod
    def _engine(self, tokens: Iterator[SampledToken], params: GenerationParams) -> Iterator[SampledToken]:
        """The mutant's own streaming loop over the real backend's tokens."""


class _ExecutorMutant(LlamaCppBackend):
    """A backend whose engine executor is the shipped one with ``executor_class``'s bug."""

    executor_class: ClassVar[type[LlamaCppExecutor]] = LlamaCppExecutor

    def create_executor(self, *, max_sequences: int, block_size: int) -> LlamaCppExecutor:
        executor = super().create_executor(max_sequences=max_sequences, block_size=block_size)
        executor.__class__ = self.executor_class
        return executor


# ---------------------------------------------------------------------- 1. KV kept across calls


class KeptKvLlamaCppBackend(LlamaCppBackend):
    """The ancestor's bug: the KV is never cleared, each request continues on top of the
    previous requests' prompts and outputs."""

    name: ClassVar[str] = "llamacpp-kept-kv"

    def _run(self, prompt: list[int], params: GenerationParams) -> Iterator[SampledToken]:
        kv = self._sequence()
        yield from sample_stream(kv.decode, prompt, params, self._tokenizer.vocab_size,
                                 room=self.n_ctx - len(prompt))


# ------------------------------------------------------------- 2. KV cleared, positions continue


class _PositionsContinueKV(SequenceKV):
    def clear(self) -> int:
        """The bug: llama.cpp's cells are freed, but the record of tokens that positions are
        counted from is kept, so the next request starts at the position the last one reached."""
        self._lib.llama_memory_clear(self._mem, False)
        return 0


class PositionsContinueLlamaCppBackend(_SequenceMutant):
    """Each request sees only its own KV, but at positions continuing from the previous
    requests'. With RoPE only relative positions matter in exact arithmetic, so greedy tokens
    mostly survive; the logits do not (0.06-0.2 in the chosen tokens' logprobs, measured)."""

    name: ClassVar[str] = "llamacpp-positions-continue"
    kv_class: ClassVar[type[SequenceKV]] = _PositionsContinueKV


# ------------------------------------------------------- 3. prefix reuse on the first token only


class _FirstTokenReuseKV(SequenceKV):
    def reuse(self, prompt: Sequence[int]) -> int:
        """The bug: the cached tokens are trusted as the prompt's prefix whenever the first token
        matches (the real reuse() computes the longest common prefix)."""
        if not self.tokens or self.tokens[0] != prompt[0]:
            return self.clear()
        keep = min(len(self.tokens), len(prompt) - 1)
        if keep < len(self.tokens):
            self._lib.llama_memory_seq_rm(self._mem, SEQ, keep, -1)
            del self.tokens[keep:]
        return keep


class FirstTokenPrefixLlamaCppBackend(_SequenceMutant):
    """``prefix_reuse = true`` (as a user may set it), with the common prefix checked on the
    first token only: a prompt sharing its first token with the previous call runs on that
    call's KV."""

    name: ClassVar[str] = "llamacpp-first-token-prefix"
    kv_class: ClassVar[type[SequenceKV]] = _FirstTokenReuseKV

    @classmethod
    def load(cls, model: Any, options: Any) -> LlamaCppBackend:
        return super().load(model, {**options, "prefix_reuse": True})


# ----------------------------------------------------------------------- 4. max_tokens counting


class StopsOneShortLlamaCppBackend(_EngineLoop):
    """The backend enforces max_tokens itself, as engines whose API takes it do, and is off by
    one. (max_tokens + 1 cannot be observed: core closes the iterator after the max_tokens-th
    token, so an extra one is never read; see docs/conformance.md.)"""

    name: ClassVar[str] = "llamacpp-stops-one-short"

    def _engine(self, tokens: Iterator[SampledToken], params: GenerationParams) -> Iterator[SampledToken]:
        for produced, token in enumerate(tokens, start=1):
            if produced >= params.max_tokens:  # the bug: checked before the token is handed over
                return
            yield token


# ------------------------------------------------------------------ 5. stop string per token


class PerTokenStopLlamaCppBackend(_EngineLoop):
    """The engine checks stop strings itself, in each token's text alone, and ends the request
    before the token that contains one (as an engine that never returns stop text does)."""

    name: ClassVar[str] = "llamacpp-per-token-stop"

    def _engine(self, tokens: Iterator[SampledToken], params: GenerationParams) -> Iterator[SampledToken]:
        for token in tokens:
            piece = self._tokenizer.token_text(token.token_id)
            if any(stop in piece for stop in params.stop):
                return
            yield token


# ------------------------------------------------------------------------------ 6. EOS ignored


class _NoEosKV(SequenceKV):
    eog: tuple[int, ...] = ()

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        """The bug: the engine's ignore_eos bias (-inf on every end-of-generation token) is
        applied to every request, whatever ``params.ignore_eos`` says."""
        logits = super().decode(tokens).copy()
        logits[list(self.eog)] = -np.inf
        return logits


class EosBannedLlamaCppBackend(_SequenceMutant):
    """EOS can never be sampled: every request runs to max_tokens."""

    name: ClassVar[str] = "llamacpp-eos-banned"
    kv_class: ClassVar[type[SequenceKV]] = _NoEosKV

    def _configure(self, kv: Any) -> None:
        kv.eog = self._tokenizer.eos_ids


# ----------------------------------------------------------------------------- 7. seed ignored


class FixedSeedLlamaCppBackend(LlamaCppBackend):
    """The request's seed is not passed on: every sampled request uses the engine's default."""

    name: ClassVar[str] = "llamacpp-fixed-seed"

    def _run(self, prompt: list[int], params: GenerationParams) -> Iterator[SampledToken]:
        return super()._run(prompt, attrs.evolve(params, seed=ENGINE_DEFAULT_SEED))


# ------------------------------------------------- 8. stream drops the text held back at the end


def _ends_in_stop_prefix(text: str, stops: Sequence[str]) -> bool:
    return any(text.endswith(stop[:k]) for stop in stops for k in range(1, len(stop)))


class DropsHeldBackLlamaCppBackend(_EngineLoop):
    """llama-cpp-python's streaming pattern: tokens whose text may be the start of a stop string
    are held back until the next token decides, and the engine's own max_tokens count ends the
    request without releasing them. (In ruvllm a stream and a non-streamed result are built by
    the same RequestOutputBuilder, so they cannot differ; this is the streaming bug that can.)"""

    name: ClassVar[str] = "llamacpp-drops-held-back"

    def _engine(self, tokens: Iterator[SampledToken], params: GenerationParams) -> Iterator[SampledToken]:
        held: list[SampledToken] = []
        text = ""
        for produced, token in enumerate(tokens, start=1):
            held.append(token)
            text += self._tokenizer.token_text(token.token_id)
            if not _ends_in_stop_prefix(text, params.stop):
                yield from held
                held.clear()
            if produced >= params.max_tokens:
                return  # the bug: whatever is still held back is dropped


# ---------------------------------------------------------------------- 9. temperature ignored


class TemperatureIgnoredLlamaCppBackend(LlamaCppBackend):
    """Temperature 0 is greedy, any other temperature samples at the engine's default 1.0 (the
    request's value is not passed on)."""

    name: ClassVar[str] = "llamacpp-temperature-ignored"

    def _run(self, prompt: list[int], params: GenerationParams) -> Iterator[SampledToken]:
        if params.temperature > 0:
            params = attrs.evolve(params, temperature=1.0)
        return super()._run(prompt, params)


# ------------------------------------------- 10. a rejected over-long prompt leaves its KV behind


class OverlongLeavesKvLlamaCppBackend(LlamaCppBackend):
    """The backend's own length guard checks the model's training context instead of its
    ``n_ctx``, and its KV is released when a request ends or is closed but not when llama.cpp
    raises: an over-long prompt fills the context until llama_decode refuses a chunk, and that
    half-filled KV stays under the next request. Core rejects such prompts before any backend
    sees them, so only a test that calls the backend's generate() directly reaches the guard."""

    name: ClassVar[str] = "llamacpp-overlong-leaves-kv"

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[SampledToken]:
        self._check_open()
        prompt = list(prompt_ids)
        n_ctx_train = int(self._lib.llama_model_n_ctx_train(self.model_handle))
        if len(prompt) >= n_ctx_train:  # the bug: not self.n_ctx
            raise ContextLengthExceeded(len(prompt), 1, n_ctx_train)
        return self._run(prompt, params)

    def _run(self, prompt: list[int], params: GenerationParams) -> Iterator[SampledToken]:
        kv = self._sequence()
        try:
            yield from sample_stream(kv.decode, prompt, params, self._tokenizer.vocab_size,
                                     room=self.n_ctx - len(prompt))
        except GeneratorExit:
            kv.clear()
            raise
        kv.clear()


# -------------------------------------------------- 11. executor frees a sequence, keeps its KV


class _StaleKvExecutor(LlamaCppExecutor):
    def free(self, seq_id: int) -> None:
        """The bug: the sequence id is handed back to the engine, its KV cells are not removed."""
        self._check_open()


class StaleKvLlamaCppBackend(_ExecutorMutant):
    """llama.cpp whose executor keeps a freed sequence's KV: the next request in that slot
    attends to the previous request's tokens."""

    name: ClassVar[str] = "llamacpp-stale-kv"

    executor_class: ClassVar[type[LlamaCppExecutor]] = _StaleKvExecutor


# ------------------------------------------------ 12. executor returns rows in the wrong order


class _SlotOrderRowsExecutor(LlamaCppExecutor):
    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        """The bug: the logits rows are returned in sequence-id order instead of the caller's
        entry order."""
        logits = super().execute(batch)
        sampled = [e.seq_id for e in batch if e.sample]
        return logits[np.argsort(sampled, kind="stable")]


class SlotOrderRowsLlamaCppBackend(_ExecutorMutant):
    """Correct whenever the engine's entries happen to be in sequence-id order (every request
    admitted at once, none finished yet); wrong as soon as a freed slot is reused."""

    name: ClassVar[str] = "llamacpp-slot-order-rows"

    executor_class: ClassVar[type[LlamaCppExecutor]] = _SlotOrderRowsExecutor


# ------------------------------------- 13. the head of a long prompt silently dropped (a window)

#: What the sliding-window mutant keeps of each sequence: far less than any stated context.
SLIDING_WINDOW = 256


class _SlidingWindowExecutor(LlamaCppExecutor):
    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        """The bug: before each step a sequence keeps only its last ``SLIDING_WINDOW`` positions
        (what a "context shift" does when it runs out of room), so a long prompt is answered
        from its tail while the request reports every prompt token as used."""
        for e in batch:
            end = e.start_pos + len(e.tokens)
            if end > SLIDING_WINDOW:
                self._lib.llama_memory_seq_rm(self._mem, e.seq_id, 0, end - SLIDING_WINDOW)
        return super().execute(batch)


class SlidingWindowLlamaCppBackend(_ExecutorMutant):
    """llama.cpp whose executor keeps a sliding window of 256 positions per sequence: long
    prompts "succeed" with their head dropped."""

    name: ClassVar[str] = "llamacpp-sliding-window"

    executor_class: ClassVar[type[LlamaCppExecutor]] = _SlidingWindowExecutor


# ------------------------------------------- 14. a pool that fails requests instead of queueing

#: Cells the over-claiming mutant really allocates (llama.cpp's least): the demand test's
#: requests need more at once.
REAL_CELLS = 256


class OverclaimedPoolLlamaCppBackend(LlamaCppBackend):
    """llama.cpp whose executor tells the engine its pool holds what the budget asks for while
    it allocates 512 cells: when demand passes 512 tokens, llama.cpp finds no free cell and
    the step's requests fail (llama-server answers 500 there) instead of waiting their turn."""

    name: ClassVar[str] = "llamacpp-overclaimed-pool"

    def create_executor(self, *, max_sequences: int, block_size: int) -> LlamaCppExecutor:
        claimed = plan_pool(n_ctx=self.n_ctx, sequences=max_sequences,
                            bytes_per_token=self.kv_bytes_per_token, budget_mib=self.options.kv_budget_mib)
        executor = LlamaCppExecutor(
            self.llama_cpp, self.model_handle, owner=self, pool=attrs.evolve(claimed, tokens=REAL_CELLS),
            max_sequences=max_sequences, block_size=block_size, max_batch_tokens=self.n_batch,
            n_threads=self.options.n_threads, n_vocab=self.tokenizer.vocab_size,
            flash_attn=claimed.flash_attn)
        executor.num_blocks = claimed.tokens // block_size
        executor.max_seq_len = claimed.per_request // block_size * block_size
        return executor


# ------------------------------------------------ 16. a rejected draft's KV stays in the sequence


class _KeepsRejectedDraftsExecutor(LlamaCppExecutor):
    def trim(self, seq_id: int, num_tokens: int) -> None:
        """The bug: the engine asks to cut a sequence back (a rejected draft's positions); its
        cells stay."""
        self._check_open()


class KeepsRejectedDraftsLlamaCppBackend(_ExecutorMutant):
    """llama.cpp whose executor never trims a sequence: the KV of a rejected draft stays where
    the accepted tokens are written next, so what follows a rejection is computed over it."""

    name: ClassVar[str] = "llamacpp-keeps-rejected-drafts"

    executor_class: ClassVar[type[LlamaCppExecutor]] = _KeepsRejectedDraftsExecutor


# ----------------------------------------------------------------------- 15. min_tokens ignored


class MinTokensIgnoredLlamaCppBackend(LlamaCppBackend):
    """The request's ``min_tokens`` does not reach the sampler (an engine sampling by itself,
    with no minimum length): the answer ends at its first EOS."""

    name: ClassVar[str] = "llamacpp-min-tokens-ignored"

    def _run(self, prompt: list[int], params: GenerationParams) -> Iterator[SampledToken]:
        return super()._run(prompt, attrs.evolve(params, min_tokens=0))


MUTANTS = (
    KeptKvLlamaCppBackend, PositionsContinueLlamaCppBackend, FirstTokenPrefixLlamaCppBackend,
    StopsOneShortLlamaCppBackend, PerTokenStopLlamaCppBackend, EosBannedLlamaCppBackend,
    FixedSeedLlamaCppBackend, DropsHeldBackLlamaCppBackend, TemperatureIgnoredLlamaCppBackend,
    OverlongLeavesKvLlamaCppBackend, StaleKvLlamaCppBackend, SlotOrderRowsLlamaCppBackend,
    SlidingWindowLlamaCppBackend, OverclaimedPoolLlamaCppBackend, MinTokensIgnoredLlamaCppBackend,
    KeepsRejectedDraftsLlamaCppBackend,
)
