"""The request-level backend contract every engine plugin implements.

A backend loads one model and turns a prompt (token ids) into a stream of sampled tokens. It
does *not* decide when to stop, build text, or measure time: core's generation driver
(:mod:`ruvllm.generation`) does that identically for every backend, and closes the backend's
iterator when the request ends. Backends whose engine exposes logits sample through
:func:`sample_stream` so that sampling is the same everywhere.

Isolation is part of the contract: each ``generate`` call starts from a clean state. No KV or
prompt-cache state left by an earlier call may change a later call's output. The conformance
suite (:mod:`ruvllm.testing`) checks exactly that.
"""

from __future__ import annotations

import abc
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from ruvllm import dry
from ruvllm.errors import BackendUnavailable
from ruvllm.executor import BatchExecutor, KvLayout
from ruvllm.generation import ending_ids
from ruvllm.models import ModelSource
from ruvllm.native_probe import NativeProbe
from ruvllm.sampling import LogitsProcessor, Sampler
from ruvllm.tokenizer import Tokenizer, text_bytes
from ruvllm.types import Capabilities, GenerationParams, ModelInfo, SampledToken


class LlmBackend(abc.ABC):
    """One loaded model on one engine."""

    #: Registry name (``ruvllm --backend NAME``).
    name: ClassVar[str]
    #: Model file formats it loads: "gguf", "hf" (a Hugging Face directory).
    formats: ClassVar[tuple[str, ...]] = ("gguf",)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this backend cannot run on this machine, or None when it can.

        Checked before loading and shown by ``ruvllm backends``; import the engine's library
        here, not at module import, so a missing library is a reason rather than a crash.
        """
        return None

    @classmethod
    def version(cls) -> str | None:
        """Version of the engine library underneath, when it can be found."""
        return None

    @classmethod
    def native_probe(cls) -> NativeProbe | None:
        """How to check, in a throwaway child process, that this engine's native code runs on
        this CPU (:mod:`ruvllm.native_probe`); None for an engine that cannot kill the process.
        Asked only once :meth:`unavailable_reason` is None."""
        return None

    @classmethod
    def fastest_here(cls, model: ModelSource) -> str | None:
        """Why this backend serves ``model`` fastest on this machine at every load, from
        measurements on CPUs of this kind; None when it makes no such claim (the default).

        ``auto`` puts the first backend of its fixed order that claims this ahead of the others
        when ``ruvllm tune`` has not measured the machine, and says why. Asked by every process
        that picks a backend: keep it cheap, and do not import the engine's heavy libraries.
        """
        return None

    @classmethod
    @abc.abstractmethod
    def capabilities(cls) -> Capabilities:
        """What this backend offers on this machine."""

    @classmethod
    @abc.abstractmethod
    def load(cls, model: ModelSource, options: Mapping[str, Any]) -> LlmBackend:
        """Load ``model``; raise :class:`ruvllm.errors.ModelLoadError` with the reason."""

    @property
    @abc.abstractmethod
    def tokenizer(self) -> Tokenizer: ...

    @property
    @abc.abstractmethod
    def info(self) -> ModelInfo: ...

    @abc.abstractmethod
    def generate(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[SampledToken]:
        """Yield sampled tokens continuing ``prompt_ids`` until the caller stops iterating.

        The caller (core) enforces max_tokens, EOS, stop ids and stop strings and then closes
        the iterator; the backend must release the request's state in a ``finally`` block.
        Return early only when the context window is full.
        """

    def cached_tokens(self) -> int | None:
        """Tokens of KV or prompt-cache state held between calls, or None if unknown.

        An isolated backend holds 0 after every call (or a bounded amount when prefix reuse is
        explicitly enabled); the conformance suite checks it does not grow across calls.
        """
        return None

    #: The ``kv_layout`` of the executor :meth:`create_executor` returns. The engine asks a
    #: ``per_sequence`` executor for extra sequences that keep finished requests' cached prefixes
    #: alive (``[engine] prefix_donor_slots``); a ``paged`` one shares prefixes by block and is
    #: asked only for the sequences that run, so it sizes nothing for sequences that never do.
    executor_kv_layout: ClassVar[KvLayout] = "paged"
    #: How many such donor sequences ``[engine] prefix_donor_slots = "auto"`` asks a
    #: ``per_sequence`` executor for: a backend whose donors cost little (llama.cpp parks them in
    #: host memory) keeps more prompts cached; where each holds its KV in the pool, fewer.
    prefix_donor_slots: ClassVar[int] = 16
    #: Most sequences the executor can hold (None: no limit), so that ``"auto"`` donors shrink to
    #: fit beside a large ``max_num_seqs`` instead of failing at start-up (llama.cpp holds 256).
    max_executor_sequences: ClassVar[int | None] = None

    def create_executor(self, *, max_sequences: int, block_size: int) -> BatchExecutor:
        """The iteration-level executor over this model, for backends whose capabilities say
        ``executor=True``; the others are driven through :meth:`generate`."""
        raise BackendUnavailable(
            self.name, "it has no iteration-level executor; the engine uses the request-level path"
        )

    def embed_batch(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """Sentence embeddings of ``inputs`` (token-id lists), float32 ``[len(inputs), dim]``,
        each row L2-normalised (OpenAI's embeddings are unit vectors), for backends whose
        capabilities say ``embeddings=True``.

        Pooling is the **mean** of the final (normed) hidden state over every token of the input,
        the same on every backend (see docs/server.md#embeddings for why not the last token).
        An input's vector must not depend on the other inputs it is batched with, beyond float
        rounding. Inputs longer than :meth:`max_embedding_tokens` are refused, never truncated.
        Called on the engine's model thread (``ServingEngine.embed_async``).
        """
        raise BackendUnavailable(
            self.name, "it cannot produce embeddings (its capabilities say embeddings=False)")

    def max_embedding_tokens(self) -> int:
        """The most tokens one input of :meth:`embed_batch` may have."""
        return self.info.context_length

    def memory_summary(self) -> str | None:
        """One line on the memory this backend sized by a setting (its KV cache), printed by
        ``ruvllm serve`` at start-up so that the size and the option that sets it are visible;
        None when it has nothing to report."""
        return None

    def close(self) -> None:
        """Free the model; the backend is unusable afterwards."""
        return None

    def __enter__(self) -> LlmBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


LogitsFn = Callable[[Sequence[int]], np.ndarray]


def request_sampler(params: GenerationParams, vocab_size: int, prompt_ids: Sequence[int],
                    tokenizer: Tokenizer, logits_processors: Sequence[LogitsProcessor] = ()) -> Sampler:
    """Core's sampler for one request, told by ``tokenizer`` what it needs beyond the logits: the
    tokens that end the request (``min_tokens`` keeps them out), each token's text (the infill
    sampler compares texts) and DRY's restart sequences."""
    breakers = functools.partial(dry.restart_sequences, tokenizer, params.dry_sequence_breakers)
    return Sampler(params, vocab_size, prompt_ids, logits_processors, end_ids=ending_ids(params, tokenizer),
                   token_bytes=functools.partial(text_bytes, tokenizer), dry_breakers=breakers)


def sample_stream(
    evaluate: LogitsFn,
    prompt_ids: Sequence[int],
    params: GenerationParams,
    vocab_size: int,
    room: int,
    *,
    tokenizer: Tokenizer | None = None,
) -> Iterator[SampledToken]:
    """Generate with core's sampler on top of an engine that returns logits.

    ``evaluate(tokens)`` appends ``tokens`` to the request's sequence and returns the logits of
    the last position. ``room`` is how many tokens fit after the prompt in the context window.
    ``tokenizer`` is the model's (:func:`request_sampler` says why the sampler needs it); without
    it a request asking for ``min_tokens`` or the infill sampler is refused.
    """
    sampler = Sampler(params, vocab_size, prompt_ids) if tokenizer is None \
        else request_sampler(params, vocab_size, prompt_ids, tokenizer)
    logits = evaluate(prompt_ids)
    for produced in range(room):
        token = sampler.sample(logits)
        yield token
        if produced + 1 < room:
            logits = evaluate([token.token_id])
