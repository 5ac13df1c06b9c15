"""A fake model for testing engine *logic* only (scheduling, block accounting, the API).

Its next-token logits are a pure function of the whole token history the executor can see, so
any mistake in block tables, copy-on-write, prefix sharing, preemption or chunking changes the
output. The paged executor really stores tokens in the blocks the engine assigns and reads the
history back through the block table; the per-sequence one keeps a list per sequence id and
checks that positions arrive contiguously.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from ruvllm.backend import LlmBackend, sample_stream
from ruvllm.executor import BatchEntry
from ruvllm.models import ModelSource
from ruvllm.types import Capabilities, GenerationParams, ModelInfo, SampledToken, SpecialTokens

VOCAB = 40
EOS = 39


def fake_logits(history: Sequence[int]) -> np.ndarray:
    seed = zlib.crc32(np.asarray(history, dtype=np.int64).tobytes())
    logits = np.random.default_rng(seed).normal(size=VOCAB).astype(np.float32)
    logits[EOS] -= 2.0  # EOS now and then, not constantly
    return logits


class FakeTokenizer:
    vocab_size = VOCAB
    bos_id = None
    eos_ids = (EOS,)

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [ord(c) % (VOCAB - 1) for c in text]

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return "".join(chr(ord("a") + i % 26) if i < 26 else f"<{i}>" for i in ids
                       if not (skip_special and i == EOS))

    def is_special(self, token_id: int) -> bool:
        return token_id == EOS

    def token_text(self, token_id: int) -> str:
        return self.decode([token_id], skip_special=False)


class PagedFakeExecutor:
    kv_layout = "paged"

    def __init__(self, num_blocks: int = 64, block_size: int = 4, max_batch_tokens: int = 64,
                 max_sequences: int = 8):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_batch_tokens = max_batch_tokens
        self.max_sequences = max_sequences
        self.kv = np.full((num_blocks, block_size), -1, dtype=np.int64)
        self.steps: list[list[BatchEntry]] = []
        self.fail_next = False

    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("injected failure")
        assert sum(len(e.tokens) for e in batch) <= self.max_batch_tokens, "batch over budget"
        assert len({e.seq_id for e in batch}) == len(batch), "a sequence twice in one step"
        self.steps.append(list(batch))
        bs = self.block_size
        for e in batch:
            end = e.start_pos + len(e.tokens)
            assert len(e.block_table) == -(-end // bs), "block table does not cover the positions"
            for i, t in enumerate(e.tokens):
                pos = e.start_pos + i
                self.kv[e.block_table[pos // bs], pos % bs] = t
        rows = []
        for e in batch:
            if e.sample:
                end = e.start_pos + len(e.tokens)
                history = [int(self.kv[e.block_table[p // bs], p % bs]) for p in range(end)]
                assert -1 not in history, "a position has no KV"
                rows.append(fake_logits(history))
        return np.stack(rows) if rows else np.zeros((0, VOCAB), np.float32)

    def free(self, seq_id: int) -> None:
        pass

    def copy_prefix(self, src_seq_id: int, dst_seq_id: int, num_tokens: int) -> None:
        raise AssertionError("paged executor asked for a per-sequence copy")

    def trim(self, seq_id: int, num_tokens: int) -> None:
        raise AssertionError("paged executor asked for a per-sequence trim")

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        for src, dst in pairs:
            self.kv[dst] = self.kv[src]


class PerSeqFakeExecutor:
    """A per-sequence executor over one pool of ``num_blocks * block_size`` cells, as llama.cpp's
    unified KV: a sequence's positions are cells, a copied prefix shares its cells, and a step
    that needs more cells than the pool has left fails (the engine's accounting let the
    executor's KV outgrow what it allocated)."""

    kv_layout = "per_sequence"

    def __init__(self, num_blocks: int = 64, block_size: int = 4, max_batch_tokens: int = 64,
                 max_sequences: int = 8):
        self.block_size = block_size
        self.num_blocks = num_blocks
        self.max_batch_tokens = max_batch_tokens
        self.max_sequences = max_sequences
        #: Per sequence: the cell of each position it holds.
        self.seqs: dict[int, list[int]] = {}
        #: Cell -> the token it holds (cells alive while any sequence holds them).
        self.cells: dict[int, int] = {}
        self._next_cell = 0
        self.freed: list[int] = []

    @property
    def cells_used(self) -> int:
        return len({c for cells in self.seqs.values() for c in cells})

    def tokens(self, seq_id: int) -> list[int]:
        return [self.cells[c] for c in self.seqs.get(seq_id, [])]

    def execute(self, batch: Sequence[BatchEntry]) -> np.ndarray:
        assert sum(len(e.tokens) for e in batch) <= self.max_batch_tokens, "batch over budget"
        new, pool = sum(len(e.tokens) for e in batch), self.num_blocks * self.block_size
        assert self.cells_used + new <= pool, f"no free KV cell: {self.cells_used} held + {new} new > {pool}"
        rows = []
        for e in batch:
            assert 0 <= e.seq_id < self.max_sequences, "sequence id outside the context's range"
            held = self.seqs.setdefault(e.seq_id, [])
            assert e.start_pos == len(held), f"seq {e.seq_id}: start {e.start_pos} != {len(held)} held"
            for t in e.tokens:
                self.cells[self._next_cell] = t
                held.append(self._next_cell)
                self._next_cell += 1
            if e.sample:
                rows.append(fake_logits(self.tokens(e.seq_id)))
        return np.stack(rows) if rows else np.zeros((0, VOCAB), np.float32)

    def free(self, seq_id: int) -> None:
        self.seqs.pop(seq_id, None)
        self.freed.append(seq_id)

    def trim(self, seq_id: int, num_tokens: int) -> None:
        del self.seqs[seq_id][num_tokens:]

    def copy_prefix(self, src_seq_id: int, dst_seq_id: int, num_tokens: int) -> None:
        src = self.seqs[src_seq_id]
        assert len(src) >= num_tokens, f"seq {src_seq_id} holds {len(src)} positions, not {num_tokens}"
        self.seqs[dst_seq_id] = list(src[:num_tokens])

    def copy_blocks(self, pairs: Sequence[tuple[int, int]]) -> None:
        raise AssertionError("per-sequence executor asked for a block copy")


class ParkingFakeExecutor(PerSeqFakeExecutor):
    """A per-sequence executor that keeps prefix donors outside its pool, as the llama.cpp
    executor parks them in host memory: a retired sequence's cells are freed at once, and a
    copy from it takes new cells, which must be free (the engine's account must have left them)."""

    detached_donors = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        #: Parked donor -> the tokens of the positions it keeps.
        self.parked: dict[int, list[int]] = {}
        self.restored = 0

    def retire(self, seq_id: int, num_tokens: int) -> None:
        self.trim(seq_id, num_tokens)
        if seq_id not in self.parked:
            self.parked[seq_id] = self.tokens(seq_id)
            del self.seqs[seq_id]

    def trim(self, seq_id: int, num_tokens: int) -> None:
        if seq_id in self.parked:
            del self.parked[seq_id][num_tokens:]
        else:
            super().trim(seq_id, num_tokens)

    def free(self, seq_id: int) -> None:
        self.parked.pop(seq_id, None)
        super().free(seq_id)

    def copy_prefix(self, src_seq_id: int, dst_seq_id: int, num_tokens: int) -> None:
        if src_seq_id not in self.parked:
            return super().copy_prefix(src_seq_id, dst_seq_id, num_tokens)
        tokens = self.parked[src_seq_id]
        assert len(tokens) >= num_tokens, f"seq {src_seq_id} parks {len(tokens)} positions, not {num_tokens}"
        pool = self.num_blocks * self.block_size
        assert self.cells_used + num_tokens <= pool, f"no free KV cell to restore {num_tokens} positions into"
        self.seqs[dst_seq_id] = []
        for t in tokens[:num_tokens]:
            self.cells[self._next_cell] = t
            self.seqs[dst_seq_id].append(self._next_cell)
            self._next_cell += 1
        self.restored += 1


def reference_greedy(prompt: Sequence[int], max_tokens: int) -> list[int]:
    """What greedy decoding of the fake model gives, computed directly."""
    hist, out = list(prompt), []
    for _ in range(max_tokens):
        t = int(np.argmax(fake_logits(hist)))
        out.append(t)
        if t == EOS:
            break
        hist.append(t)
    return out


class FakeBackend(LlmBackend):
    """Request-level + executor backend over the fake model."""

    name = "fake"

    def __init__(self, executor: Any = None, *, executor_capable: bool = True, concurrent: bool = False,
                 context_length: int = 256):
        self._executor = executor
        self._executor_capable = executor_capable
        self._concurrent = concurrent
        self.closed = False
        self.generate_calls = 0
        self._info = ModelInfo(name="fake", architecture="fake", context_length=context_length,
                               vocab_size=VOCAB, special_tokens=SpecialTokens(bos_id=None, eos_ids=(EOS,)))

    def capabilities(self) -> Capabilities:  # type: ignore[override]
        return Capabilities(executor=self._executor_capable, concurrent_requests=self._concurrent)

    @classmethod
    def load(cls, model: ModelSource, options: Mapping[str, Any]) -> FakeBackend:
        return cls()

    @property
    def tokenizer(self) -> FakeTokenizer:
        return FakeTokenizer()

    @property
    def info(self) -> ModelInfo:
        return self._info

    def create_executor(self, *, max_sequences: int, block_size: int):
        if self._executor is None:
            self._executor = PagedFakeExecutor(block_size=block_size, max_sequences=max_sequences)
        return self._executor

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams) -> Iterator[SampledToken]:
        self.generate_calls += 1
        hist: list[int] = []

        def evaluate(tokens: Sequence[int]) -> np.ndarray:
            hist.extend(tokens)
            return fake_logits(hist)

        room = self._info.context_length - len(prompt_ids)
        yield from sample_stream(evaluate, prompt_ids, params, VOCAB, room)

    def close(self) -> None:
        self.closed = True
