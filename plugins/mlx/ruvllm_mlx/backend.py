"""The MLX backend at request level (``generate``) and its iteration-level executor factory.

MLX is imported inside :meth:`MlxBackend.load` and the helpers it calls, never at module
import, so ``ruvllm backends`` can list this backend with a reason where MLX is missing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from importlib import metadata
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from ruvllm.backend import LlmBackend, sample_stream
from ruvllm.executor import BatchExecutor, KvLayout
from ruvllm.models import ModelSource
from ruvllm.options import parse_options
from ruvllm.tokenizer import Tokenizer
from ruvllm.types import Capabilities, GenerationParams, ModelInfo, SampledToken, SpecialTokens

from ruvllm_mlx.device import device_and_notes, import_error
from ruvllm_mlx.options import MlxOptions

if TYPE_CHECKING:
    from ruvllm_mlx.kv_cache import SequenceCache
    from ruvllm_mlx.model import Transformer

#: Longest prompt slice run in one forward; bounds the attention scores' memory.
PREFILL_CHUNK = 512


class MlxBackend(LlmBackend):
    name: ClassVar[str] = "mlx"
    executor_kv_layout: ClassVar[KvLayout] = "per_sequence"
    formats: ClassVar[tuple[str, ...]] = ("gguf", "hf")

    def __init__(self, model: Transformer, tokenizer: Tokenizer, info: ModelInfo, options: MlxOptions,
                 weights_mode: str, load_seconds: float):
        self.model = model
        self._tokenizer = tokenizer
        self._info = info
        self.options = options
        #: "quantized" or "dequantized", as resolved for this device.
        self.weights_mode = weights_mode
        self.load_seconds = load_seconds
        self._active: SequenceCache | None = None

    # -- discovery ---------------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        reason = import_error()
        if reason is not None:
            return reason
        try:
            import tokenizers  # noqa: F401
        except ImportError as exc:
            return f"the tokenizers library is missing ({exc}); pip install tokenizers"
        return None

    @classmethod
    def version(cls) -> str | None:
        try:
            return metadata.version("mlx")
        except metadata.PackageNotFoundError:
            return None

    @classmethod
    def capabilities(cls) -> Capabilities:
        device, notes = device_and_notes()
        return Capabilities(
            streaming=True,
            executor=True,
            logprobs=True,
            core_sampler=True,
            concurrent_requests=False,
            device=device,
            notes=(*notes, "request-level calls run one at a time; concurrency goes through the "
                           "executor (one batched forward per step)",
                   "no LoRA, ISQ or paged attention: per-sequence KV caches"),
        )

    # -- loading -----------------------------------------------------------------------------
    @classmethod
    def load(cls, model: ModelSource, options: Mapping[str, Any]) -> MlxBackend:
        from ruvllm.errors import BackendUnavailable, ModelLoadError

        opts = parse_options(MlxOptions, cls.name, options)
        reason = cls.unavailable_reason()
        if reason:
            raise BackendUnavailable(cls.name, reason)
        from ruvllm_mlx.device import metal_available
        from ruvllm_mlx.model import Transformer

        start = time.perf_counter()
        metal = metal_available()
        if model.format == "gguf":
            from ruvllm.hf_tokenizer import HfTokenizer

            from ruvllm_mlx.gguf_loader import load_gguf, plain_metadata

            config, weights, meta = load_gguf(model.path)
            tokenizer = HfTokenizer.from_gguf_metadata(plain_metadata(meta, "tokenizer."),
                                                       vocab_size=config.vocab_size, source=str(model.path))
            quant = _gguf_quantization(weights)
        elif model.format == "hf":
            from ruvllm.hf_tokenizer import HfTokenizer

            from ruvllm_mlx.hf_loader import load_hf

            config, weights, meta = load_hf(model.path)
            tokenizer = HfTokenizer.from_hf_dir(model.path)
            quant = "mlx-affine" if "embed.scales" in weights else None
        else:
            raise ModelLoadError(model.name, f"the mlx backend cannot read {model.format!r} models")
        mode = opts.resolved_weights(metal)
        group = 32
        if model.format == "hf":
            group = int(meta.get("quantization", {}).get("group_size", 64))
        transformer = Transformer(
            config, weights, mode=mode, dtype=opts.resolved_dtype(metal), group_size=group,
            quantize_bits=opts.quantize_bits, quantize_group_size=opts.quantize_group_size,
        )
        del weights
        context = config.context_length if opts.context_length is None else min(
            config.context_length, opts.context_length)
        special = SpecialTokens(
            bos_id=tokenizer.bos_id, eos_ids=tokenizer.eos_ids,
            bos_text=tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else "",
            eos_text=tokenizer.token_text(tokenizer.eos_ids[0]) if tokenizer.eos_ids else "",
            fim=tokenizer.fim_tokens(),
        )
        info = ModelInfo(
            name=model.name, architecture=config.architecture, context_length=context,
            vocab_size=config.vocab_size, special_tokens=special, chat_template=tokenizer.chat_template,
            path=str(model.path), quantization=quant,
        )
        return cls(transformer, tokenizer, info, opts, mode, time.perf_counter() - start)

    # -- request level -----------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    @property
    def info(self) -> ModelInfo:
        return self._info

    def kv_quantize(self) -> tuple[int, int] | None:
        """(bits, group size) of the quantized KV cache, or None for float K/V."""
        if self.options.kv_cache == "quantized":
            return self.options.kv_bits, self.options.kv_group_size
        return None

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[SampledToken]:
        from ruvllm_mlx.mlx_core import mx
        from ruvllm_mlx.model import Segment

        # A fresh cache per request is the isolation guarantee: nothing outlives the call.
        cache = self.model.new_cache(self.kv_quantize())
        self._active = cache

        def evaluate(tokens: Sequence[int]) -> np.ndarray:
            logits = None
            for i in range(0, len(tokens), PREFILL_CHUNK):
                chunk = list(tokens[i:i + PREFILL_CHUNK])
                logits = self.model.forward(chunk, [Segment(cache, cache.length, len(chunk))],
                                            [len(chunk) - 1])
                mx.eval(logits, cache.arrays())
            return np.array(logits[0], dtype=np.float32)

        try:
            room = self._info.context_length - len(prompt_ids)
            if room > 0:
                yield from sample_stream(evaluate, prompt_ids, params, self._info.vocab_size, room,
                                         tokenizer=self.tokenizer)
        finally:
            self._active = None

    def cached_tokens(self) -> int | None:
        return 0 if self._active is None else self._active.length

    # -- iteration level ---------------------------------------------------------------------
    def create_executor(self, *, max_sequences: int, block_size: int) -> BatchExecutor:
        from ruvllm_mlx.executor import MlxBatchExecutor

        return MlxBatchExecutor(self.model, max_sequences=max_sequences, block_size=block_size,
                                context_length=self._info.context_length,
                                kv_quantize=self.kv_quantize())

    def close(self) -> None:
        self._active = None
        self.model = None  # type: ignore[assignment]


def _gguf_quantization(weights: Mapping[str, Any]) -> str:
    """A short label of how the GGUF's projection weights are stored (e.g. "Q4/Q8 packed")."""
    bits = set()
    from ruvllm_mlx.layers import packed_bits

    for name, w in weights.items():
        if name.endswith(".weight") and name[:-7] + ".scales" in weights:
            bits.add(packed_bits(w, weights[name[:-7] + ".scales"], 32))
    return "+".join(f"q{b}" for b in sorted(bits)) + " (affine, group 32)" if bits else "float"
