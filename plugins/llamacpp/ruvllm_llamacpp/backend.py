"""``LlamaCppBackend``: request-level generation on llama.cpp with ruvllm's own sampler.

llama.cpp is driven through its C API (``llama_batch`` / ``llama_decode`` /
``llama_get_logits_ith``) rather than ``Llama.create_completion``: ruvllm needs the raw logits
of each step so that core's sampler, stop handling and detokenizer behave exactly as on every
other backend, and it needs to own the KV memory to guarantee request isolation.

The request-level context (one sequence of ``n_ctx`` tokens, 180 MiB of f16 KV for the embedded
model's 8,192) is created by the first ``generate``: a ServingEngine batches through its own
executor context and never calls ``generate``, so ``ruvllm serve`` does not pay for it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import attrs
import numpy as np
from ruvllm.backend import LlmBackend, sample_stream
from ruvllm.embeddings import check_embedding_inputs, normalise_rows
from ruvllm.errors import BackendError, ModelLoadError
from ruvllm.executor import KvLayout
from ruvllm.generation import check_prompt
from ruvllm.models import ModelSource
from ruvllm.native_probe import NativeProbe
from ruvllm.options import parse_options
from ruvllm.types import Capabilities, GenerationParams, ModelInfo, SampledToken

from ruvllm_llamacpp import _lib, probe
from ruvllm_llamacpp.embeddings import LlamaCppEmbedder
from ruvllm_llamacpp.kv import SequenceKV
from ruvllm_llamacpp.kv_pool import (
    CELL_GRANULARITY,
    KV_TYPES,
    LLAMA_MAX_SEQ,
    MIB,
    flash_attn_enabled,
    kv_bytes_per_token,
)
from ruvllm_llamacpp.metadata import model_info, read_metadata
from ruvllm_llamacpp.options import LlamaCppOptions
from ruvllm_llamacpp.tokenizer import LlamaCppTokenizer

GGUF_MAGIC = b"GGUF"


class _Handles:
    """The C objects one backend owns, freed once (by close() or when the backend is collected)."""

    def __init__(self, llama_cpp: ModuleType, model: int):
        self.lib = llama_cpp
        self.model: int | None = model
        self.ctx: int | None = None
        self.batch: Any = None
        #: The embeddings context, created on first use (freed before the model).
        self.embedder: LlamaCppEmbedder | None = None
        #: The model's tokenizer, closed before the model is freed (it may encode on any thread).
        self.tokenizer: LlamaCppTokenizer | None = None

    def close(self) -> None:
        if self.embedder is not None:
            self.embedder.close()
            self.embedder = None
        if self.batch is not None:
            self.lib.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx is not None:
            self.lib.llama_free(self.ctx)
            self.ctx = None
        if self.tokenizer is not None:
            self.tokenizer.close()
        if self.model is not None:
            self.lib.llama_model_free(self.model)
            self.model = None


def _check_gguf(source: ModelSource) -> None:
    """Reject what llama.cpp would reject, with a reason a user can act on."""
    path = Path(source.path)
    if source.format != "gguf":
        raise ModelLoadError(
            source.name,
            f"the llamacpp backend reads GGUF files, and {path} is a {source.format} model; "
            "convert it with llama.cpp's convert_hf_to_gguf.py or pick another backend",
        )
    if not path.is_file():
        raise ModelLoadError(source.name, f"{path} is not a file")
    with path.open("rb") as fh:
        magic = fh.read(4)
    if magic != GGUF_MAGIC:
        raise ModelLoadError(
            source.name,
            f"{path} is not a GGUF file (it starts with {magic!r}, not {GGUF_MAGIC!r}); "
            "the download may be incomplete or the file is in another format",
        )


class LlamaCppBackend(LlmBackend):
    """One GGUF model in one llama.cpp context, serving one request at a time.

    Isolation: every ``generate`` starts from an empty KV memory and clears it again when it
    ends. With ``prefix_reuse = true`` the KV of the previous call is kept and only the part of
    the new prompt after the longest common token prefix is evaluated. The logits equal an empty
    KV's up to the rounding of a differently batched evaluation (see ruvllm_llamacpp.kv and
    docs/backends/llamacpp.md): greedy tokens can differ only at near-ties (tested).
    """

    name: ClassVar[str] = "llamacpp"
    executor_kv_layout: ClassVar[KvLayout] = "per_sequence"
    #: Donors wait in host memory (ruvllm_llamacpp.parked), within the pool's 256 MiB: 64 let 32
    #: clients taking turns find their prompts again (16 found none; docs/engine.md "Parked
    #: prefixes"); each costs a llama.cpp sequence id (a logits row: 192 KiB for the embedded
    #: model's vocabulary).
    prefix_donor_slots: ClassVar[int] = 64
    max_executor_sequences: ClassVar[int | None] = LLAMA_MAX_SEQ
    formats: ClassVar[tuple[str, ...]] = ("gguf",)

    # ----------------------------------------------------------------- class-level queries
    @classmethod
    def unavailable_reason(cls) -> str | None:
        return _lib.problem()

    @classmethod
    def version(cls) -> str | None:
        return _lib.version()

    @classmethod
    def native_probe(cls) -> NativeProbe | None:
        return probe.native_probe()

    @classmethod
    def capabilities(cls) -> Capabilities:
        """Capabilities on this machine before a model is loaded (device "cpu"); a loaded
        backend reports its own device, which depends on ``n_gpu_layers``."""
        return cls._capabilities(gpu_layers=0)

    @classmethod
    def _capabilities(cls, gpu_layers: int) -> Capabilities:
        notes: list[str] = []
        gpu_build = _lib.problem() is None and bool(_lib.lib(cls.name).llama_supports_gpu_offload())
        if not gpu_build:
            notes.append("this llama-cpp-python build has no GPU offload (CPU only); "
                         "see docs/backends/llamacpp.md to build it with CUDA or Metal")
        elif gpu_layers == 0:
            notes.append("GPU offload is available: set n_gpu_layers (-1 = all layers)")
        return Capabilities(
            streaming=True,
            executor=True,
            logprobs=True,
            core_sampler=True,
            embeddings=True,
            # CPU kernels only: a GPU build's offloaded layers were never checked (cell_order).
            batch_invariant_mode=not (gpu_build and gpu_layers != 0),
            device="gpu" if gpu_build and gpu_layers != 0 else "cpu",
            notes=tuple(notes),
        )

    # ----------------------------------------------------------------------------- loading
    @classmethod
    def load(cls, model: ModelSource, options: Mapping[str, Any]) -> LlamaCppBackend:
        opts = parse_options(LlamaCppOptions, cls.name, options)  # bad options fail before any file I/O
        llama_cpp = _lib.lib(cls.name)
        _check_gguf(model)
        _lib.set_verbose(opts.verbose)

        mparams = llama_cpp.llama_model_default_params()
        # -1 means "every layer"; llama.cpp clamps INT32_MAX to the model's layer count.
        mparams.n_gpu_layers = 0x7FFFFFFF if opts.n_gpu_layers == -1 else opts.n_gpu_layers
        with _lib.capture_log(llama_cpp, opts.verbose) as log:
            model_ptr = llama_cpp.llama_model_load_from_file(str(model.path).encode("utf-8"), mparams)
        if not model_ptr:
            raise ModelLoadError(model.name, log.reason() or f"llama.cpp could not load {model.path}")
        handles = _Handles(llama_cpp, model_ptr)
        try:
            n_ctx_train = int(llama_cpp.llama_model_n_ctx_train(model_ptr))
            n_ctx = opts.n_ctx or n_ctx_train
            if n_ctx_train > 0:
                n_ctx = min(n_ctx, n_ctx_train)
            # llama.cpp pads a sequence's window up to whole 256-cell blocks: asking for the padded
            # size makes the window known before any context exists, and exactly what is allocated.
            n_ctx = -(-n_ctx // CELL_GRANULARITY) * CELL_GRANULARITY
            return cls(llama_cpp, model, opts, handles, n_ctx=n_ctx, n_batch=min(opts.n_batch, n_ctx),
                       n_ctx_train=n_ctx_train)
        except BaseException:
            handles.close()
            raise

    def __init__(self, llama_cpp: ModuleType, source: ModelSource, options: LlamaCppOptions,
                 handles: _Handles, *, n_ctx: int, n_batch: int, n_ctx_train: int = 0):
        """Use :meth:`load`; this wires up an already loaded model."""
        self._lib = llama_cpp
        self._handles = handles
        self._finalizer = weakref.finalize(self, handles.close)
        self.options = options
        self.source = source
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        #: The model's training context (0 when the GGUF does not say).
        self.n_ctx_train = n_ctx_train
        assert handles.model is not None
        vocab = llama_cpp.llama_model_get_vocab(handles.model)
        self._tokenizer = handles.tokenizer = LlamaCppTokenizer(llama_cpp, vocab)
        self.metadata = read_metadata(llama_cpp, handles.model)
        self._info = model_info(llama_cpp, handles.model, source, self.metadata, self._tokenizer, n_ctx)
        #: KV bytes of one token (keys and values over every layer in the type_k / type_v cell
        #: types), for sizing contexts.
        self.kv_bytes_per_token = kv_bytes_per_token(llama_cpp, handles.model, self.metadata,
                                                     type_k=options.type_k, type_v=options.type_v)
        #: llama.cpp's flash attention in generate()'s one-sequence context and the embeddings
        #: context (the executor's pool decides its own: kv_pool.flash_attn_enabled).
        self.flash_attn = flash_attn_enabled(options.flash_attn, shared_pool=False, type_v=options.type_v)
        #: Sequence 0 of the request-level context, created by the first generate().
        self._kv: SequenceKV | None = None
        #: The KV line of the last executor made by create_executor (for memory_summary).
        self._executor_kv: str | None = None
        #: Prompt tokens of the last generate() whose KV came from the previous call (always 0
        #: unless prefix_reuse is on); the rest of the prompt was evaluated.
        self.last_reused_tokens = 0
        # Instance view of the capabilities: the device depends on this load's n_gpu_layers.
        self.capabilities = lambda: type(self)._capabilities(options.n_gpu_layers)  # type: ignore[method-assign]

    # ------------------------------------------------------------------ handles for executors
    @property
    def llama_cpp(self) -> ModuleType:
        """The ``llama_cpp`` module (for an executor built on this backend's model)."""
        return self._lib

    @property
    def model_handle(self) -> int:
        self._check_open()
        assert self._handles.model is not None
        return self._handles.model

    @property
    def context_handle(self) -> int:
        """The request-level context (created now if no generate() did yet)."""
        self._sequence()
        assert self._handles.ctx is not None
        return self._handles.ctx

    @property
    def sequence(self) -> SequenceKV:
        """Sequence 0 of the request-level context, the KV ``generate()`` runs on (created now if
        no generate() did yet). For code that needs the raw logits rows of that context, e.g. the
        teacher-forced comparison of prefix reuse with a fresh prefill in tests/llamacpp."""
        return self._sequence()

    def _sequence(self) -> SequenceKV:
        """Sequence 0 of the request-level context, which is created on first use."""
        self._check_open()
        if self._kv is not None:
            return self._kv
        lib, handles, opts = self._lib, self._handles, self.options
        cparams = lib.llama_context_default_params()
        cparams.n_ctx = self.n_ctx
        cparams.n_batch = self.n_batch
        cparams.n_ubatch = self.n_batch
        cparams.n_seq_max = 1
        cparams.n_threads = opts.n_threads
        cparams.n_threads_batch = opts.n_threads
        cparams.embeddings = False
        cparams.no_perf = not opts.verbose
        cparams.flash_attn_type = (lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if self.flash_attn
                                   else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        cparams.type_k = KV_TYPES[opts.type_k].ggml_type
        cparams.type_v = KV_TYPES[opts.type_v].ggml_type
        with _lib.capture_log(lib, opts.verbose) as log:
            ctx = lib.llama_init_from_model(handles.model, cparams)
        if not ctx:
            reason = log.reason() or f"llama.cpp could not create a context of {self.n_ctx} tokens"
            raise ModelLoadError(self.source.name, reason)
        handles.ctx = ctx
        handles.batch = lib.llama_batch_init(self.n_batch, 0, 1)
        self._kv = SequenceKV(lib, ctx, handles.batch, self.n_batch, self._tokenizer.vocab_size)
        return self._kv

    def create_executor(self, *, max_sequences: int, block_size: int, batch_invariant: bool = False):
        """The ServingEngine's iteration-level executor: a second context over this model, one KV
        pool of ``kv_budget_mib`` shared by ``max_sequences`` sequences (ruvllm_llamacpp.executor);
        ``batch_invariant``: every row's logits its own sequence's alone (ruvllm_llamacpp.cell_order)."""
        from ruvllm_llamacpp.executor import create_executor

        self._check_open()
        executor = create_executor(self, max_sequences=max_sequences, block_size=block_size,
                                   batch_invariant=batch_invariant)
        self._executor_kv = executor.pool.describe()
        return executor

    # ------------------------------------------------------------------------- embeddings
    def embed_batch(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """``/v1/embeddings`` through llama.cpp's MEAN pooling, in a context of its own created
        on first use (see ruvllm_llamacpp.embeddings); L2-normalised rows."""
        batch = check_embedding_inputs(inputs, vocab_size=self._tokenizer.vocab_size,
                                       max_tokens=self.max_embedding_tokens())
        handles = self._handles
        if handles.embedder is None:
            self._check_open()
            opts = self.options
            with _lib.capture_log(self._lib, opts.verbose) as log:
                try:
                    handles.embedder = LlamaCppEmbedder(
                        self._lib, handles.model, n_tokens=self.max_embedding_tokens(),
                        n_threads=opts.n_threads, flash_attn=self.flash_attn)
                except BackendError as exc:
                    raise BackendError(f"{exc} ({log.reason()})" if log.reason() else str(exc)) from None
        return normalise_rows(handles.embedder.embed(batch))

    def max_embedding_tokens(self) -> int:
        """The ``embedding_tokens`` option, capped at the window the model was trained for."""
        return min(self.options.embedding_tokens, self.n_ctx_train or self.options.embedding_tokens)

    def memory_summary(self) -> str | None:
        """The KV this backend holds: the last executor's, and the request-level context's once
        a generate() created it."""
        lines = [self._executor_kv] if self._executor_kv else []
        if self._kv is not None:
            lines.append(f"request-level KV cache: {self.n_ctx} tokens x 1 sequence = "
                         f"{self.n_ctx * self.kv_bytes_per_token / MIB:.1f} MiB (n_ctx)")
        return "; ".join(lines) or None

    # ------------------------------------------------------------------------- the contract
    @property
    def tokenizer(self) -> LlamaCppTokenizer:
        return self._tokenizer

    @property
    def info(self) -> ModelInfo:
        return self._info

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[SampledToken]:
        self._check_open()
        prompt = list(prompt_ids)
        # The answer may run on to the end of the context (sample_stream stops there), so the
        # prompt needs room for one token, whatever max_tokens says.
        check_prompt(prompt, attrs.evolve(params, max_tokens=1, min_tokens=0), self.n_ctx,
                     self._tokenizer.vocab_size)
        # Validated eagerly (above); the generator below touches the KV only once iterated.
        return self._run(prompt, params)

    def _run(self, prompt: list[int], params: GenerationParams) -> Iterator[SampledToken]:
        kv = self._sequence()
        ended_cleanly = False
        try:
            start = kv.reuse(prompt) if self.options.prefix_reuse else kv.clear()
            self.last_reused_tokens = start
            first = True

            def evaluate(tokens: Sequence[int]) -> np.ndarray:
                nonlocal first
                if first:  # the prompt: only the part not already in the KV
                    first = False
                    tokens = prompt[start:]
                return kv.decode(tokens)

            yield from sample_stream(evaluate, prompt, params, self._tokenizer.vocab_size,
                                     room=self.n_ctx - len(prompt), tokenizer=self.tokenizer)
            ended_cleanly = True
        except GeneratorExit:
            # The caller stopped the request (EOS, stop string, max_tokens): the KV is intact.
            ended_cleanly = True
            raise
        finally:
            if not (self.options.prefix_reuse and ended_cleanly):
                kv.clear()

    def cached_tokens(self) -> int:
        """Tokens held in llama.cpp's KV memory right now (0 between isolated calls)."""
        if self._handles.ctx is None or self._kv is None:
            return 0
        return self._kv.engine_tokens()

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._handles.model is None

    def _check_open(self) -> None:
        if self._handles.model is None:
            raise BackendError(f"the llamacpp backend for {self.source.name!r} is closed")

    def __repr__(self) -> str:
        return (f"LlamaCppBackend(model={self.source.name!r}, n_ctx={self.n_ctx}, "
                f"n_threads={self.options.n_threads}, closed={self.closed})")
