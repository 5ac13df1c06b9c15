"""The iteration-level contract: one forward pass per engine step over every running request.

The ServingEngine owns sequences, KV blocks and sampling; an executor only runs the model. Each
step it receives a mixed batch — prefill chunks of new prompts and single decode tokens of
running requests — and returns the logits of the positions that need sampling. Reading the
weights once per step for all sequences is where batching's throughput comes from.

Two KV layouts exist:

- ``paged``: the executor stores KV in physical blocks the engine assigns; each entry's
  ``block_table`` says which block holds positions ``[i*block_size, (i+1)*block_size)``.
  Sharing a cached prefix is sharing blocks; :meth:`BatchExecutor.copy_blocks` serves
  copy-on-write.
- ``per_sequence``: the engine underneath keeps KV per sequence id (llama.cpp, MLX). Block
  tables are still given, so capacity accounting is identical; a cached prefix is shared by
  :meth:`BatchExecutor.copy_prefix` from the sequence that holds it, and a finished sequence
  kept for its cached prefix is cut to it with :meth:`BatchExecutor.trim`. The engine's block
  count is the executor's whole KV: the executor must hold no position the engine did not
  allocate (an executor that shares a copied prefix's memory, as llama.cpp's unified pool
  does, matches the engine's shared blocks exactly). An executor may keep such a prefix donor
  outside that memory: it sets ``detached_donors = True`` and defines ``retire(seq_id,
  num_tokens)``, which the engine then calls instead of ``trim`` for a donor (the llama.cpp
  executor parks donors in host memory; docs/engine.md, "Parked prefixes").

An executor whose kernels compute a row differently in a large step than in a small one may set
``split_prompt_tail = True``: the engine then ends every prefill with a chunk of its own from the
prompt's last whole block on, the rows a later prefix-cache hit on the same prompt recomputes,
so a repeated request computes them the same way (llama.cpp's flash attention; docs/engine.md).
With ``split_prompt_tail_rows = N`` (the fewest rows its other kernel takes), a prompt prefilled
alone in one step of fewer than N rows is not split: every row of it already takes the small kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, Protocol, runtime_checkable

import attrs
import numpy as np

KvLayout = Literal["paged", "per_sequence"]


@attrs.frozen(kw_only=True)
class BatchEntry:
    """One sequence's share of a step."""

    seq_id: int
    #: New tokens to run, at positions start_pos .. start_pos + len(tokens) - 1.
    tokens: tuple[int, ...]
    start_pos: int
    #: Physical block ids covering positions [0, start_pos + len(tokens)).
    block_table: tuple[int, ...]
    #: True when the logits after the last token are needed (a decode step, or the final
    #: chunk of a prefill).
    sample: bool = True
    #: LoRA adapter this sequence runs with (None: the base model). Executors of backends
    #: without LoRA never receive one: the engine refuses such requests at submit time.
    adapter: str | None = None
    #: True when the logits of EVERY token of this entry are needed (prompt logprobs): the
    #: executor then returns ``len(tokens)`` rows for it, the last of which is the sampling row
    #: when ``sample`` is also set. Only executors with ``prompt_logits = True`` receive it.
    all_logits: bool = False
    #: Compute this entry's rows with the executor's batch-invariant kernels (a request's own
    #: ``GenerationParams.batch_invariant``; only executors with ``invariant_rows = True``
    #: receive it).
    invariant: bool = False


@runtime_checkable
class BatchExecutor(Protocol):
    """Runs the model one step at a time for the engine."""

    kv_layout: KvLayout
    block_size: int
    #: KV capacity in blocks of ``block_size`` tokens.
    num_blocks: int
    #: Most tokens one step may hold.
    max_batch_tokens: int
    #: Most sequences that may hold KV at once.
    max_sequences: int

    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        """Run one forward pass; return float logits ``[n, vocab]`` in batch order: one row per
        entry with ``sample=True``, or ``len(tokens)`` rows for an entry with ``all_logits``."""
        ...

    def free(self, seq_id: int) -> None:
        """Forget everything about ``seq_id``; its KV may be reused at once."""
        ...

    def copy_prefix(self, src_seq_id: int, dst_seq_id: int, num_tokens: int) -> None:
        """Give ``dst`` the KV of the first ``num_tokens`` positions of ``src``
        (``per_sequence`` layout); any count, not only whole blocks: a hit may end inside a
        block (docs/engine.md)."""
        ...

    def trim(self, seq_id: int, num_tokens: int) -> None:
        """Keep only the first ``num_tokens`` positions of ``seq_id`` (``per_sequence`` layout)."""
        ...

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Copy physical block ``src`` to ``dst`` for each pair (``paged`` layout)."""
        ...
