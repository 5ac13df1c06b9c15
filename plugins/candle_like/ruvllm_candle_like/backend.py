"""``candle_like``: the pure-PyTorch reference backend.

Request level: every ``generate`` call builds a fresh per-request KV cache (contiguous 16-bit,
or the two-tier hot/cold cache), prefills the prompt in chunks and decodes through core's
:func:`~ruvllm.backend.sample_stream`; the cache is dropped in ``finally``. Iteration level:
:meth:`create_executor` gives a paged :class:`~ruvllm_candle_like.executor.PagedExecutor`
that the ServingEngine drives one batched forward per step.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from ruvllm.backend import LlmBackend, sample_stream
from ruvllm.embeddings import check_embedding_inputs, normalise_rows
from ruvllm.errors import BackendError, BatchInvariantUnsupported, InvalidRequest, ModelLoadError, RuvllmError
from ruvllm.executor import BatchExecutor
from ruvllm.hf_tokenizer import HfTokenizer
from ruvllm.models import ModelSource
from ruvllm.options import parse_options
from ruvllm.types import Capabilities, GenerationParams, ModelInfo, SampledToken, SpecialTokens

from ruvllm_candle_like import auto_claim, blockmm
from ruvllm_candle_like.cpu_dtype import bf16_note, warn_once
from ruvllm_candle_like.embeddings import mean_pooled
from ruvllm_candle_like.kv_contiguous import ContiguousCache
from ruvllm_candle_like.kv_two_tier import TwoTierCache, TwoTierSettings
from ruvllm_candle_like.loading import LoadedModel, load
from ruvllm_candle_like.lora import AdapterRegistry, LoraAdapter, LoraPlan, load_peft
from ruvllm_candle_like.options import BackendOptions
from ruvllm_candle_like.projection import PACKABLE, unpacked_note

RequestCache = ContiguousCache | TwoTierCache

log = logging.getLogger(__name__)


def cpu_notes() -> tuple[str, ...]:
    """What this CPU changes for the backend: the dtype auto picks without native bf16, each
    dtype whose weights oneDNN cannot pack here, and GGUF weights running dense for want of the
    native block kernel."""
    blocks = blockmm.unavailable()
    dense = f"int4_weights=auto runs GGUF projections dense here: {blocks}" if blocks else None
    return tuple(n for n in (bf16_note(), *(unpacked_note(d) for d in PACKABLE), dense) if n)


class CandleLikeBackend(LlmBackend):
    name: ClassVar[str] = "candle_like"
    formats: ClassVar[tuple[str, ...]] = ("gguf", "hf")

    def __init__(self, loaded: LoadedModel, options: BackendOptions, source: ModelSource):
        self._loaded = loaded
        self.options = options
        self.model = loaded.model
        self.device = loaded.model.device
        self.dtype = loaded.model.dtype
        self.kv_dtype = options.resolve_kv_dtype(self.dtype)
        self._source = source
        self._live_tokens = 0
        self._lock = threading.Lock()
        #: The KV line of the last executor made by create_executor (for memory_summary).
        self._executor_kv: str | None = None
        #: check_kernels' verdict once run: "" when the mode holds here, else why not.
        self._kernel_check: str | None = None
        #: Named LoRA adapters, shared by generate() and every executor of this backend.
        self.adapters = AdapterRegistry()
        cfg = loaded.config
        tok = loaded.tokenizer
        self._info = ModelInfo(
            name=source.name,
            architecture=cfg.model_type,
            context_length=loaded.model.max_positions,
            vocab_size=cfg.vocab_size,
            special_tokens=SpecialTokens(
                bos_id=tok.bos_id, eos_ids=tok.eos_ids,
                bos_text=tok.token_text(tok.bos_id) if tok.bos_id is not None else "",
                eos_text=tok.token_text(tok.eos_ids[0]) if tok.eos_ids else "",
                fim=tok.fim_tokens(),
            ),
            chat_template=loaded.chat_template,
            path=str(source.path),
            quantization=loaded.quantization,
            parameters=loaded.model.parameter_count(),
        )

    # -- discovery -----------------------------------------------------------------------

    @classmethod
    def unavailable_reason(cls) -> str | None:
        for module in ("torch", "gguf", "tokenizers", "safetensors"):
            try:
                __import__(module)
            except ImportError as exc:
                return f"the {module!r} package cannot be imported ({exc}); pip install ruvllm-candle-like"
        return None

    @classmethod
    def fastest_here(cls, model: ModelSource) -> str | None:
        return auto_claim.fastest_here(model)

    @classmethod
    def version(cls) -> str | None:
        return f"torch {torch.__version__}"

    @classmethod
    def capabilities(cls) -> Capabilities:
        device = "cpu"
        if torch.cuda.is_available():
            device = "cuda"
        elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
            device = "mps"
        return Capabilities(
            streaming=True, executor=True, logprobs=True, core_sampler=True,
            concurrent_requests=False, paged_attention=True, lora=True, embeddings=True, device=device,
            batch_invariant_mode=True,
            notes=cpu_notes() if device == "cpu" else (),
        )

    @classmethod
    def load(cls, model: ModelSource, options: Mapping[str, Any]) -> CandleLikeBackend:
        opts = parse_options(BackendOptions, cls.name, options)
        device = opts.resolve_device()
        dtype = opts.resolve_dtype(device, model.format)
        if opts.n_threads is not None and device.type == "cpu":
            torch.set_num_threads(opts.n_threads)
        if opts.prepack_weights and device.type == "cpu" and (note := unpacked_note(dtype)):
            warn_once(f"unpacked {dtype}", "candle_like: %s", note)  # once: every projection falls back
        int4 = opts.resolve_int4(device, model.format, dtype)
        try:
            loaded = load(model, dtype=dtype, device=device, context_length=opts.context_length,
                          prepack=opts.prepack_weights, int4=int4,
                          dense_rows=opts.dense_from_rows if opts.dense_weights else None,
                          int8=int4 and opts.resolve_int8())
        except RuvllmError:
            raise
        except Exception as exc:  # torch/safetensors errors become a load error with the reason
            raise ModelLoadError(str(model.path), f"{type(exc).__name__}: {exc}") from exc
        return cls(loaded, opts, model)

    # -- request level -------------------------------------------------------------------

    @property
    def tokenizer(self) -> HfTokenizer:
        return self._loaded.tokenizer

    @property
    def info(self) -> ModelInfo:
        return self._info

    def cached_tokens(self) -> int:
        return self._live_tokens

    def new_cache(self, capacity: int) -> RequestCache:
        """A fresh per-request cache of the configured kind."""
        cfg = self._loaded.config
        if self.options.kv_cache == "two_tier":
            settings = TwoTierSettings.from_options(self.options, cfg, self.model.max_positions)
            return TwoTierCache(cfg, settings, compute_dtype=self.dtype, device=self.device,
                                capacity=capacity)
        return ContiguousCache(cfg, capacity, kv_dtype=self.kv_dtype, compute_dtype=self.dtype,
                               device=self.device)

    # -- LoRA adapters (ruvllm.adapters.AdapterHost) -------------------------------------

    def load_adapter(self, name: str, path: str | Path) -> LoraAdapter:
        """Load a PEFT LoRA directory under ``name`` (replacing an adapter of that name)."""
        adapter = load_peft(path, name, self._loaded.config, dtype=self.dtype, device=self.device)
        self.adapters.publish(adapter)
        return adapter

    def publish_adapter(self, adapter: LoraAdapter) -> int:
        """Make ``adapter`` (built for this model) available under its name; returns its revision.
        Through a ServingEngine, call this via ``engine.publish`` so it lands between steps."""
        return self.adapters.publish(adapter)

    def unload_adapter(self, name: str) -> None:
        """New requests naming ``name`` are refused; requests already running keep it."""
        self.adapters.unload(name)

    def adapter_names(self) -> tuple[str, ...]:
        return self.adapters.names()

    def adapter_revision(self, name: str) -> int:
        return self.adapters.revision(name)

    # -- embeddings ----------------------------------------------------------------------

    def embed(self, ids: Sequence[int]) -> np.ndarray:
        """Mean-pooled final hidden state of ``ids`` under the base model (float32 [hidden], not
        normalised; SONA's prompt routing). Keeps no state, so it is safe beside generation."""
        if not ids:
            raise InvalidRequest("ids", "need at least one token to embed")
        ids = list(ids)[: self.model.max_positions]
        return mean_pooled(self.model, [ids], max_batch_tokens=self.options.max_batch_tokens)[0]

    def embed_batch(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """``/v1/embeddings``: mean-pooled, L2-normalised vectors of whole inputs, batched
        (see ruvllm_candle_like.embeddings)."""
        batch = check_embedding_inputs(inputs, vocab_size=self._info.vocab_size,
                                       max_tokens=self.max_embedding_tokens())
        return normalise_rows(mean_pooled(self.model, batch, max_batch_tokens=self.options.max_batch_tokens))

    def max_embedding_tokens(self) -> int:
        return self.model.max_positions

    @torch.inference_mode()
    def step(self, cache: RequestCache, tokens: Sequence[int],
             lora: LoraPlan | None = None) -> torch.Tensor:
        """Append ``tokens`` to ``cache`` and return the float32 logits of the last one."""
        chunk = self.options.prefill_chunk
        logits = None
        for i in range(0, len(tokens), chunk):
            part = tokens[i : i + chunk]
            n = len(part)
            cache.begin(n)
            ids = torch.tensor(part, dtype=torch.long, device=self.device)
            pos = torch.arange(cache.position, cache.position + n, device=self.device)
            last = torch.tensor([n - 1], device=self.device)
            logits = self.model.forward(ids, pos, cache, last, lora)
            cache.advance()
        assert logits is not None
        return logits[0]

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[SampledToken]:
        ctx = self.model.max_positions
        room = ctx - len(prompt_ids)
        if room <= 0:
            return
        # The adapter is taken once: the whole request runs with this version of it.
        adapter = None if params.adapter is None else self.adapters.resolve(params.adapter)
        lora = None if adapter is None else LoraPlan([(adapter, None)])
        cache = self.new_cache(len(prompt_ids) + min(params.max_tokens, room))

        def evaluate(tokens: Sequence[int]) -> np.ndarray:
            try:
                logits = self.step(cache, tokens, lora)
            except RuntimeError as exc:
                raise BackendError(f"candle_like forward failed: {exc}") from exc
            self._live_tokens = cache.length
            return logits.cpu().numpy()

        try:
            yield from sample_stream(evaluate, prompt_ids, params, self._loaded.config.vocab_size, room,
                                     tokenizer=self.tokenizer)
        finally:
            # The cache dies with this generator frame: nothing survives the call.
            self._live_tokens = 0

    # -- iteration level -----------------------------------------------------------------

    def create_executor(self, *, max_sequences: int, block_size: int,
                        batch_invariant: bool = False) -> BatchExecutor:
        """``batch_invariant``: every row computed independently of the step it shares
        (:mod:`ruvllm_candle_like.invariant`), after checking this machine's kernels allow it."""
        from ruvllm_candle_like.executor import PagedExecutor

        if batch_invariant:
            self._check_invariance()
        two_tier = None
        # A request may ask for the guarantee on its own where the mode's kernels hold here.
        offered = not batch_invariant and self.options.kv_cache != "two_tier"
        rows_check = self._invariance_problem if offered else None
        if self.options.kv_cache == "two_tier":
            cfg = self._loaded.config
            two_tier = TwoTierSettings.from_options(self.options, cfg, self.model.max_positions)
        # max_kv_tokens bounds one sequence here (the engine refuses a longer request); the
        # request-level cache evicts its oldest tokens instead (kv_paged_two_tier's docstring).
        executor = PagedExecutor(self.model, max_sequences=max_sequences, block_size=block_size,
                                 num_tokens=self.options.kv_cache_tokens,
                                 max_batch_tokens=self.options.max_batch_tokens, kv_dtype=self.kv_dtype,
                                 adapters=self.adapters, two_tier=two_tier,
                                 max_seq_len=two_tier.max_tokens if two_tier else None,
                                 batch_invariant=batch_invariant, rows_check=rows_check,
                                 compile_decode=self.options.compile_decode)
        self._executor_kv = executor.describe()
        log.info("candle_like executor: %s", self._executor_kv)
        return executor

    def _check_invariance(self) -> None:
        if self.options.kv_cache == "two_tier":
            # What a cold position reads depends on when its block migrated.
            raise BatchInvariantUnsupported(self.name, "kv_cache=two_tier quantises a position's K/V "
                                            "depending on when its block left the hot window")
        reason = self._invariance_problem()
        if reason is not None:
            raise BatchInvariantUnsupported(self.name, reason)

    def _invariance_problem(self) -> str | None:
        """Why this machine's kernels cannot hold the mode, or None; checked once per model."""
        from ruvllm_candle_like.invariant import check_kernels

        if self._kernel_check is None:
            reason = check_kernels(self.model)
            self._kernel_check = ("" if reason is None else
                                  f"{reason} on this machine ({str(self.dtype).removeprefix('torch.')})")
        return self._kernel_check or None

    def memory_summary(self) -> str | None:
        """The KV of the last executor (printed by ``ruvllm serve`` at start-up)."""
        return None if self._executor_kv is None else f"candle_like {self._executor_kv}"

    def close(self) -> None:
        self._loaded = None  # type: ignore[assignment]
        self.model = None  # type: ignore[assignment]
