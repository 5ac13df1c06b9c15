"""The iteration-level executor: one batched MLX forward per engine step.

KV is held per sequence id (``kv_layout = "per_sequence"``): each sequence owns a
:class:`~ruvllm_mlx.kv_cache.SequenceCache`. A step flattens the new tokens of every entry —
decode tokens and prefill chunks alike — into one ``[N, hidden]`` batch, so each weight matrix
is read once per step for all sequences; attention alone runs per sequence over its own cache.
Block tables are accepted for the engine's capacity accounting; this layout does not index
memory by block.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from ruvllm.errors import BackendError, InvalidRequest
from ruvllm.executor import BatchEntry, KvLayout
from ruvllm.tokenizer import require_in_vocabulary

from ruvllm_mlx.kv_cache import SequenceCache
from ruvllm_mlx.mlx_core import mx
from ruvllm_mlx.model import Segment

if TYPE_CHECKING:
    from ruvllm_mlx.model import Transformer

#: KV memory the executor offers the engine by default; the engine's block count follows.
DEFAULT_KV_MEMORY_BYTES = 2 * 1024**3


class MlxBatchExecutor:
    kv_layout: KvLayout = "per_sequence"
    #: Honours ``BatchEntry.all_logits`` (prompt logprobs).
    prompt_logits = True

    def __init__(self, model: Transformer, *, max_sequences: int, block_size: int, context_length: int,
                 kv_quantize: tuple[int, int] | None = None, max_batch_tokens: int = 2048,
                 kv_memory_bytes: int = DEFAULT_KV_MEMORY_BYTES):
        for name, value in (("max_sequences", max_sequences), ("block_size", block_size),
                            ("max_batch_tokens", max_batch_tokens)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InvalidRequest(name, f"must be a positive integer, got {value!r}", value)
        self.model = model
        self.block_size = block_size
        self.max_sequences = max_sequences
        self.max_batch_tokens = max_batch_tokens
        #: Longest sequence one cache may hold (the model's context window).
        self.max_seq_len = context_length
        self.kv_quantize = kv_quantize
        blocks_per_seq = -(-context_length // block_size)
        budget_blocks = max(1, kv_memory_bytes // (self.kv_bytes_per_token() * block_size))
        self.num_blocks = int(min(max_sequences * blocks_per_seq, budget_blocks))
        self._caches: dict[int, SequenceCache] = {}

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one position costs across all layers."""
        c = self.model.config
        itemsize = 4 if self.model.dtype == mx.float32 else 2
        per_head = c.head_dim * itemsize
        if self.kv_quantize is not None:
            bits, group = self.kv_quantize
            per_head = c.head_dim * bits // 8 + 2 * (c.head_dim // group) * itemsize
        return 2 * c.num_layers * c.num_kv_heads * per_head

    def _cache(self, seq_id: int) -> SequenceCache:
        cache = self._caches.get(seq_id)
        if cache is None:
            if len(self._caches) >= self.max_sequences:
                raise BackendError(
                    f"sequence {seq_id} would be the {len(self._caches) + 1}th holding KV, "
                    f"but the executor was created with max_sequences={self.max_sequences}"
                )
            cache = self._caches[seq_id] = self.model.new_cache(self.kv_quantize)
        return cache

    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        if not batch:
            raise InvalidRequest("batch", "must hold at least one entry")
        seen: set[int] = set()
        tokens: list[int] = []
        segments: list[Segment] = []
        rows: list[int] = []
        vocab = self.model.config.vocab_size
        for entry in batch:
            if entry.seq_id in seen:
                raise InvalidRequest("batch", f"sequence {entry.seq_id} appears twice in one step")
            seen.add(entry.seq_id)
            if not entry.tokens:
                raise InvalidRequest("tokens", f"entry for sequence {entry.seq_id} has no tokens")
            end = entry.start_pos + len(entry.tokens)
            if end > self.max_seq_len:
                raise InvalidRequest("start_pos", f"sequence {entry.seq_id} would reach position "
                                                  f"{end}, past the context length {self.max_seq_len}")
            require_in_vocabulary("tokens", entry.tokens, vocab)
            cache = self._cache(entry.seq_id)
            if entry.start_pos > cache.length:
                raise InvalidRequest(
                    "start_pos", f"sequence {entry.seq_id} holds KV for {cache.length} positions but "
                                 f"the entry starts at {entry.start_pos}")
            segments.append(Segment(cache, entry.start_pos, len(entry.tokens)))
            tokens.extend(entry.tokens)
            if entry.all_logits:  # prompt logprobs: a row for every token of the entry
                rows.extend(range(len(tokens) - len(entry.tokens), len(tokens)))
            elif entry.sample:
                rows.append(len(tokens) - 1)
        if len(tokens) > self.max_batch_tokens:
            raise InvalidRequest(
                "batch", f"{len(tokens)} tokens exceed max_batch_tokens={self.max_batch_tokens}")
        if not rows:
            # Nothing to sample (all prefill chunks): still run the model for the KV.
            logits = self.model.forward(tokens, segments, [len(tokens) - 1])
            mx.eval(logits, [a for s in segments for a in s.cache.arrays()])
            return np.zeros((0, vocab), dtype=np.float32)
        logits = self.model.forward(tokens, segments, rows)
        mx.eval(logits, [a for s in segments for a in s.cache.arrays()])
        return np.array(logits, dtype=np.float32)

    def free(self, seq_id: int) -> None:
        self._caches.pop(seq_id, None)

    def copy_prefix(self, src_seq_id: int, dst_seq_id: int, num_tokens: int) -> None:
        src = self._caches.get(src_seq_id)
        if src is None:
            raise InvalidRequest("src_seq_id", f"sequence {src_seq_id} holds no KV to copy")
        if src_seq_id == dst_seq_id:
            src.length = min(src.length, num_tokens)
            return
        self._cache(dst_seq_id).copy_prefix_from(src, num_tokens)
        mx.eval(self._caches[dst_seq_id].arrays())

    def trim(self, seq_id: int, num_tokens: int) -> None:
        cache = self._caches.get(seq_id)
        if cache is not None:
            cache.length = min(cache.length, num_tokens)

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        if pairs:
            raise BackendError(
                "the mlx executor keeps KV per sequence (kv_layout='per_sequence') and has no "
                "physical blocks to copy; share prefixes with copy_prefix"
            )

    def held_tokens(self) -> int:
        """Positions of KV currently held across all sequences (for tests and metrics)."""
        return sum(c.length for c in self._caches.values())

    def close(self) -> None:
        self._caches.clear()
