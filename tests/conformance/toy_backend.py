"""A tiny deterministic backend whose only purpose is to prove the conformance suite can fail.

It is the one fake in this project: a byte-level tokenizer and a "model" whose logits are a
pseudo-random function of a hash of its whole KV context (every token fed so far). With
``leaky=False`` it clears that context at the start and end of every request, as the contract
demands. With ``leaky=True`` it keeps it across ``generate()`` calls, which is exactly the bug
of ruvllm's ancestor (its clear_kv_cache() reset a position but kept the KV): the next request
then continues on top of the previous ones, so its greedy output changes.

Sampling goes through :func:`ruvllm.sample_stream`, so the suite's sampling, stop and logprob
tests exercise core's real code paths on top of it.

The executor toys put the same "model" under the ServingEngine (iteration level, KV kept per
sequence id as llama.cpp does) to prove the engine tests can fail: ``toy-batched`` adds a small
batch-size-dependent perturbation to its logits (as kernels that block by batch size do), so its
batched greedy output flips near-ties yet is correct; ``toy-stale-kv`` forgets to drop a freed
sequence's KV, so the next request in that slot attends to a previous one's tokens.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

import numpy as np
from ruvllm import Capabilities, LlmBackend, ModelInfo, ModelSource, SampledToken, SpecialTokens
from ruvllm.backend import sample_stream
from ruvllm.executor import BatchEntry, KvLayout
from ruvllm.types import GenerationParams

BOS, EOS, IM_START = 256, 257, 258
SPECIAL_TEXT = {BOS: "<s>", EOS: "<|im_end|>", IM_START: "<|im_start|>"}
VOCAB = 259
CONTEXT = 2048
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
NEWLINE = ord("\n")


class ByteTokenizer:
    """UTF-8 bytes as tokens 0-255 plus three special tokens (the Tokenizer protocol)."""

    @property
    def vocab_size(self) -> int:
        return VOCAB

    @property
    def bos_id(self) -> int | None:
        return BOS

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (EOS,)

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        ids = [BOS] if add_special else []
        if not parse_special:
            return ids + list(text.encode("utf-8"))
        rest = text
        while rest:
            hits = [(rest.find(t), i) for i, t in SPECIAL_TEXT.items() if t in rest]
            if not hits:
                ids += list(rest.encode("utf-8"))
                break
            at, special = min(hits)
            ids += [*rest[:at].encode("utf-8"), special]
            rest = rest[at + len(SPECIAL_TEXT[special]) :]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        out, chunk = [], bytearray()
        for t in ids:
            if t < 256:
                chunk.append(t)
                continue
            out.append(chunk.decode("utf-8", errors="replace"))
            chunk = bytearray()
            if not skip_special:
                out.append(SPECIAL_TEXT[t])
        out.append(chunk.decode("utf-8", errors="replace"))
        return "".join(out)

    def is_special(self, token_id: int) -> bool:
        return token_id >= 256

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], skip_special=False)


def _letter_bias() -> np.ndarray:
    """Make the toy write lowercase words: letters and spaces favoured, control bytes not."""
    bias = np.full(VOCAB, -4.0, dtype=np.float32)
    bias[ord("a") : ord("z") + 1] = 3.0
    bias[ord(" ")] = 2.5
    bias[[ord("."), ord(",")]] = 1.0
    bias[[BOS, IM_START]] = -50.0
    return bias


class ToyBackend(LlmBackend):
    """Correct toy backend: every request starts from, and leaves, an empty KV context."""

    name: ClassVar[str] = "toy"
    #: Keep the KV context across generate() calls (the bug the suite must catch).
    leaky: ClassVar[bool] = False

    def __init__(self, model: ModelSource, *, leaky: bool | None = None):
        self._model = model
        self._leaky = self.leaky if leaky is None else leaky
        self._tokenizer = ByteTokenizer()
        self._kv: list[int] = []
        self._bias = _letter_bias()
        self._info = ModelInfo(
            name=f"toy-bytes ({model.name})", architecture="toy-hash", context_length=CONTEXT,
            vocab_size=VOCAB, chat_template=CHATML, path=str(model.path),
            special_tokens=SpecialTokens(bos_id=BOS, eos_ids=(EOS,), bos_text=SPECIAL_TEXT[BOS],
                                         eos_text=SPECIAL_TEXT[EOS]),
        )

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(streaming=True, logprobs=True, core_sampler=True)

    @classmethod
    def load(cls, model: ModelSource, options: Mapping[str, Any]) -> ToyBackend:
        # The toy computes its logits from a hash; it only borrows the model's name.
        return cls(model, leaky=options.get("leaky"))

    @property
    def tokenizer(self) -> ByteTokenizer:
        return self._tokenizer

    @property
    def info(self) -> ModelInfo:
        return self._info

    def _logits(self, context: Sequence[int]) -> np.ndarray:
        """Logits of the next token: a hash of the whole context seeds the noise; EOS becomes
        likelier the longer the current line is, so chat replies end by themselves."""
        digest = hashlib.blake2b(np.asarray(context, dtype=np.int32).tobytes(), digest_size=8).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        logits = rng.standard_normal(VOCAB).astype(np.float32) + self._bias
        line = 0
        for t in reversed(context):
            if t == NEWLINE or t >= 256:
                break
            line += 1
        logits[EOS] = -8.0 + 0.4 * line
        return logits

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[SampledToken]:
        if not self._leaky:
            self._kv = []

        def evaluate(tokens: Sequence[int]) -> np.ndarray:
            self._kv.extend(tokens)
            return self._logits(self._kv)

        try:
            yield from sample_stream(evaluate, prompt_ids, params, VOCAB, CONTEXT - len(prompt_ids),
                                     tokenizer=self.tokenizer)
        finally:
            if not self._leaky:
                self._kv = []

    def cached_tokens(self) -> int:
        return len(self._kv)


class LeakyToyBackend(ToyBackend):
    """The ancestor's bug: KV context kept across generate() calls."""

    name: ClassVar[str] = "toy-leaky"
    leaky: ClassVar[bool] = True


class KvHoardingToyBackend(ToyBackend):
    """Isolated outputs and a ``cached_tokens()`` of 0 after every call, yet each call's KV
    buffers stay referenced: a list of caches kept "for statistics", or a cache object caught in
    a reference cycle. Each buffer is the size the loaded model's KV really takes for the call's
    tokens (``ruvllm.testing.kv_geometry``, at 2 bytes per element), so memory grows exactly as
    a real KV leak would; only the suite's RSS probe, measured outside the backend, can see it."""

    name: ClassVar[str] = "toy-kv-hoarder"

    def __init__(self, model: ModelSource, *, leaky: bool | None = None):
        from ruvllm.testing.kv_geometry import kv_geometry

        super().__init__(model, leaky=leaky)
        self._kv_bytes_per_token = kv_geometry(model).bytes_per_token()
        self._kept: list[np.ndarray] = []

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[SampledToken]:
        produced = 0
        try:
            for token in super().generate(prompt_ids, params):
                produced += 1
                yield token
        finally:
            # np.ones writes every byte, so the pages are resident like a filled KV cache.
            self._kept.append(np.ones((len(prompt_ids) + produced) * self._kv_bytes_per_token, np.uint8))


class NoLogprobsToyBackend(ToyBackend):
    """Correct, but declares no logprobs and no core sampler: capability-gated tests skip."""

    name: ClassVar[str] = "toy-nologprobs"

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(streaming=True, logprobs=False, core_sampler=False,
                            notes=("toy backend declaring fewer capabilities",))


class ToyExecutor:
    """The toy model one step at a time: KV per sequence id (the ``per_sequence`` layout).

    ``batch_noise`` perturbs each row by a deterministic function of the batch size, which is
    what batched kernels do to real logits; ``keep_stale`` makes :meth:`free` a no-op (the bug).
    """

    kv_layout = "per_sequence"
    max_batch_tokens = 4096

    def __init__(self, backend: ToyBackend, *, max_sequences: int, block_size: int, batch_noise: float,
                 keep_stale: bool):
        self._backend = backend
        self.block_size = block_size
        self.max_sequences = max_sequences
        self.max_seq_len = CONTEXT
        self.num_blocks = max_sequences * CONTEXT // block_size
        self._noise = batch_noise
        self._keep_stale = keep_stale
        #: What attention sees for each sequence id: every token written to it since its last free.
        self._cells: dict[int, list[int]] = {}

    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        rows = []
        for entry in batch:
            cells = self._cells.setdefault(entry.seq_id, [])
            cells.extend(entry.tokens)
            if entry.sample:
                row = self._backend._logits(cells)
                if self._noise and len(batch) > 1:
                    digest = hashlib.blake2b(np.asarray(cells, np.int32).tobytes(), digest_size=8,
                                             salt=len(batch).to_bytes(8, "little")).digest()
                    jitter = np.random.default_rng(int.from_bytes(digest, "little")).standard_normal(VOCAB)
                    row = row + (self._noise * jitter).astype(np.float32)
                rows.append(row)
        return np.stack(rows) if rows else np.zeros((0, VOCAB), np.float32)

    def free(self, seq_id: int) -> None:
        if not self._keep_stale:
            self._cells.pop(seq_id, None)

    def copy_prefix(self, src_seq_id: int, dst_seq_id: int, num_tokens: int) -> None:
        self._cells[dst_seq_id] = list(self._cells.get(src_seq_id, ())[:num_tokens])

    def trim(self, seq_id: int, num_tokens: int) -> None:
        if seq_id in self._cells:
            del self._cells[seq_id][num_tokens:]

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        raise NotImplementedError("the per_sequence layout never copies blocks")


class BatchedToyBackend(ToyBackend):
    """Correct, served through an executor whose batched logits differ slightly from solo ones."""

    name: ClassVar[str] = "toy-batched"
    batch_noise: ClassVar[float] = 0.05
    keep_stale: ClassVar[bool] = False
    batch_invariant: ClassVar[bool] = False
    executor_kv_layout: ClassVar[KvLayout] = "per_sequence"

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(streaming=True, logprobs=True, core_sampler=True, executor=True,
                            batch_invariant=cls.batch_invariant)

    def create_executor(self, *, max_sequences: int, block_size: int) -> ToyExecutor:
        return ToyExecutor(self, max_sequences=max_sequences, block_size=block_size,
                           batch_noise=self.batch_noise, keep_stale=self.keep_stale)


class ClaimsInvariantToyBackend(BatchedToyBackend):
    """The same batch-dependent numerics, wrongly declared batch-invariant: exact equality then
    applies, and the near-tie flips make it fail."""

    name: ClassVar[str] = "toy-batched-claims-invariant"
    batch_invariant: ClassVar[bool] = True


class StaleKvToyBackend(BatchedToyBackend):
    """The executor bug: freeing a sequence leaves its KV, so the slot's next request sees it."""

    name: ClassVar[str] = "toy-stale-kv"
    keep_stale: ClassVar[bool] = True


class InvariantModeToyBackend(BatchedToyBackend):
    """Offers the batch-invariant mode (``[engine] batch_invariant``): with it, its executor
    computes a row without the batch-size perturbation, as a real backend fixes its reductions."""

    name: ClassVar[str] = "toy-invariant-mode"
    #: The perturbation the executor keeps in the mode (0: the mode holds).
    mode_noise: ClassVar[float] = 0.0

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(streaming=True, logprobs=True, core_sampler=True, executor=True,
                            batch_invariant_mode=True)

    def create_executor(self, *, max_sequences: int, block_size: int,
                        batch_invariant: bool = False) -> ToyExecutor:
        return ToyExecutor(self, max_sequences=max_sequences, block_size=block_size,
                           batch_noise=self.mode_noise if batch_invariant else self.batch_noise,
                           keep_stale=self.keep_stale)


class VariantInModeToyBackend(InvariantModeToyBackend):
    """Claims the mode but still changes its reduction with the batch size: what the suite's
    batch-invariance class must fail."""

    name: ClassVar[str] = "toy-invariant-mode-broken"
    mode_noise: ClassVar[float] = 0.05


TOY_BACKENDS = (ToyBackend, LeakyToyBackend, KvHoardingToyBackend, NoLogprobsToyBackend, BatchedToyBackend,
                ClaimsInvariantToyBackend, StaleKvToyBackend, InvariantModeToyBackend,
                VariantInModeToyBackend)


def register_toy_backends() -> None:
    """Register the toys in-process, the way a conftest or ``-p`` plugin injects a backend."""
    from ruvllm.plugins import get_registry

    registry = get_registry()
    for cls in TOY_BACKENDS:
        registry.register_backend(cls, provider=__name__)
