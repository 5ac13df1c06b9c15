"""``LlamaCppBackend``: request-level generation on llama.cpp with ruvllm's own sampler.

llama.cpp is driven through its C API (``llama_batch`` / ``llama_decode`` /
``llama_get_logits_ith``) rather than ``Llama.create_completion``: ruvllm needs the raw logits
of each step so that core's sampler, stop handling and detokenizer behave exactly as on every
other backend, and it needs to own the KV memory to guarantee request isolation.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, ClassVar

import numpy as np
from ruvllm.backend import LlmBackend, sample_stream
from ruvllm.errors import BackendError, ContextLengthExceeded, InvalidRequest, ModelLoadError
from ruvllm.models import ModelSource
from ruvllm.options import parse_options
from ruvllm.types import Capabilities, GenerationParams, ModelInfo, SampledToken

from ruvllm_llamacpp import _lib
from ruvllm_llamacpp.kv import SequenceKV
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

    def close(self) -> None:
        if self.batch is not None:
            self.lib.llama_batch_free(self.batch)
            self.batch = None
        if self.ctx is not None:
            self.lib.llama_free(self.ctx)
            self.ctx = None
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
    the new prompt after the longest common token prefix is evaluated; the tokens produced are
    the same as from an empty KV (tested), only the prefill is shorter.
    """

    name: ClassVar[str] = "llamacpp"
    formats: ClassVar[tuple[str, ...]] = ("gguf",)

    # ----------------------------------------------------------------- class-level queries
    @classmethod
    def unavailable_reason(cls) -> str | None:
        return _lib.problem()

    @classmethod
    def version(cls) -> str | None:
        return _lib.version()

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
            n_batch = min(opts.n_batch, n_ctx)
            cparams = llama_cpp.llama_context_default_params()
            cparams.n_ctx = n_ctx
            cparams.n_batch = n_batch
            cparams.n_ubatch = n_batch
            cparams.n_seq_max = 1
            cparams.n_threads = opts.n_threads
            cparams.n_threads_batch = opts.n_threads
            cparams.embeddings = False
            cparams.no_perf = not opts.verbose
            cparams.flash_attn_type = (
                llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if opts.flash_attn
                else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
            )
            with _lib.capture_log(llama_cpp, opts.verbose) as log:
                ctx = llama_cpp.llama_init_from_model(model_ptr, cparams)
            if not ctx:
                raise ModelLoadError(
                    model.name, log.reason() or f"llama.cpp could not create a context of {n_ctx} tokens"
                )
            handles.ctx = ctx
            # llama.cpp pads n_ctx (to a multiple of 256): report the window it really has.
            real_ctx = int(llama_cpp.llama_n_ctx(ctx))
            return cls(llama_cpp, model, opts, handles, n_ctx=real_ctx, n_batch=n_batch)
        except BaseException:
            handles.close()
            raise

    def __init__(self, llama_cpp: ModuleType, source: ModelSource, options: LlamaCppOptions,
                 handles: _Handles, *, n_ctx: int, n_batch: int):
        """Use :meth:`load`; this wires up an already created model and context."""
        self._lib = llama_cpp
        self._handles = handles
        self._finalizer = weakref.finalize(self, handles.close)
        self.options = options
        self.source = source
        self.n_ctx = n_ctx
        self.n_batch = n_batch
        assert handles.model is not None and handles.ctx is not None
        vocab = llama_cpp.llama_model_get_vocab(handles.model)
        self._tokenizer = LlamaCppTokenizer(llama_cpp, vocab)
        self.metadata = read_metadata(llama_cpp, handles.model)
        self._info = model_info(llama_cpp, handles.model, source, self.metadata, self._tokenizer, n_ctx)
        handles.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        self._kv = SequenceKV(llama_cpp, handles.ctx, handles.batch, n_batch, self._tokenizer.vocab_size)
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
        self._check_open()
        assert self._handles.ctx is not None
        return self._handles.ctx

    def create_executor(self, *, max_sequences: int, block_size: int):
        """The ServingEngine's iteration-level executor: a second context over this model with
        ``max_sequences`` sequences of ``n_ctx`` tokens each (see ruvllm_llamacpp.executor)."""
        from ruvllm_llamacpp.executor import create_executor

        self._check_open()
        return create_executor(self, max_sequences=max_sequences, block_size=block_size)

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
        if not prompt:
            raise InvalidRequest("prompt", "must contain at least one token; got an empty prompt")
        n_vocab = self._tokenizer.vocab_size
        bad = next((t for t in prompt if not 0 <= t < n_vocab), None)
        if bad is not None:
            raise InvalidRequest("prompt", f"token id {bad} is outside the vocabulary [0, {n_vocab})", bad)
        if len(prompt) >= self.n_ctx:
            raise ContextLengthExceeded(len(prompt), 1, self.n_ctx)
        # Validated eagerly (above); the generator below touches the KV only once iterated.
        return self._run(prompt, params)

    def _run(self, prompt: list[int], params: GenerationParams) -> Iterator[SampledToken]:
        kv = self._kv
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
                                     room=self.n_ctx - len(prompt))
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
        if self._handles.ctx is None:
            return 0
        return self._kv.engine_tokens()

    def close(self) -> None:
        self._finalizer()

    @property
    def closed(self) -> bool:
        return self._handles.ctx is None

    def _check_open(self) -> None:
        if self._handles.ctx is None:
            raise BackendError(f"the llamacpp backend for {self.source.name!r} is closed")

    def __repr__(self) -> str:
        return (f"LlamaCppBackend(model={self.source.name!r}, n_ctx={self.n_ctx}, "
                f"n_threads={self.options.n_threads}, closed={self.closed})")
