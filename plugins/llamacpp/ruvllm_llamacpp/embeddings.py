"""Sentence embeddings through llama.cpp's embeddings mode (``/v1/embeddings``).

A separate llama.cpp context over the backend's already loaded model, with ``embeddings = true``
and ``pooling_type = MEAN``: llama.cpp averages each sequence's final normed hidden states
itself and ``llama_get_embeddings_seq`` hands back one vector per sequence. Several inputs go
into one ``llama_batch``, each its own sequence id; the KV memory is cleared before every batch,
so no input ever sees another's tokens or an earlier request's.

The context is created by the first embeddings request (``ruvllm serve`` idles without it) and
sized by the ``embedding_tokens`` option: it is the KV cells, the batch and the micro-batch
(a pooled sequence must fit in one micro-batch), so it is also the longest input. llama.cpp's
graph still computes logits for every token in embeddings mode, so the compute buffer grows
with it: about ``embedding_tokens x n_vocab x 4`` bytes (96 MiB at 512 for the embedded model).
The KV is one unified buffer (``kv_unified = true``, as llama-cpp-python's own embedding mode
does): with split streams every sequence would get only ``n_ctx / n_seq_max`` cells.

Every call must come from the engine's model thread, like the executor's.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import ModuleType

import numpy as np
from ruvllm.errors import BackendError

from ruvllm_llamacpp.batch_context import BatchContext

_DECODE_ERRORS = {1: "no free KV slot", 2: "aborted", -1: "invalid batch"}


def packed_runs(lengths: Sequence[int], *, max_tokens: int, max_sequences: int) -> Iterator[tuple[int, int]]:
    """``(start, end)`` runs of consecutive inputs that fit one batch: at most ``max_tokens``
    tokens in all and ``max_sequences`` inputs (each input alone fits: callers check that)."""
    start, total = 0, 0
    for i, n in enumerate(lengths):
        if i > start and (total + n > max_tokens or i - start >= max_sequences):
            yield start, i
            start, total = i, 0
        total += n
    if start < len(lengths):
        yield start, len(lengths)


class LlamaCppEmbedder:
    """An embeddings-mode llama.cpp context of ``n_tokens`` cells over an already loaded model."""

    def __init__(self, llama_cpp: ModuleType, model: int, *, n_tokens: int, n_threads: int,
                 flash_attn: bool = False):
        self._lib = llama_cpp
        self.n_tokens = n_tokens
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        self.max_sequences = min(n_tokens, int(llama_cpp.llama_max_parallel_sequences()))
        self._context = BatchContext(
            llama_cpp, model, n_ctx=n_tokens, n_batch=n_tokens, n_seq_max=self.max_sequences,
            kv_unified=True, n_threads=n_threads, flash_attn=flash_attn,
            pooling=llama_cpp.LLAMA_POOLING_TYPE_MEAN,
            failure=(f"llama.cpp could not create an embeddings context of {n_tokens} tokens; "
                     "lower [backends.llamacpp] embedding_tokens"))
        c = self._context
        self._ctx, self._mem, self._batch = c.ctx, c.mem, c.batch
        self._tok, self._pos, self._seq_ptrs = c.tokens, c.positions, c.seq_ptrs
        # Every token is an output: llama.cpp pools over the outputs of a sequence.
        c.wants_output[:] = 1

    def embed(self, inputs: Sequence[Sequence[int]]) -> np.ndarray:
        """Mean-pooled vectors (not normalised), float32 ``[len(inputs), n_embd]``; every input
        has 1..``n_tokens`` valid token ids (the backend checks)."""
        if self._context.closed:
            raise BackendError("the llama.cpp embeddings context is closed")
        out = np.empty((len(inputs), self.n_embd), dtype=np.float32)
        runs = packed_runs([len(ids) for ids in inputs], max_tokens=self.n_tokens,
                           max_sequences=self.max_sequences)
        for start, end in runs:
            self._lib.llama_memory_clear(self._mem, False)
            n = 0
            for seq, ids in enumerate(inputs[start:end]):
                k = len(ids)
                self._tok[n:n + k] = ids
                self._pos[n:n + k] = np.arange(k, dtype=self._pos.dtype)
                for j in range(n, n + k):
                    self._seq_ptrs[j][0] = seq
                n += k
            self._batch.n_tokens = n
            rc = self._lib.llama_decode(self._ctx, self._batch)
            if rc != 0:
                raise BackendError(f"llama_decode failed with code {rc} ({_DECODE_ERRORS.get(rc, 'fatal')}) "
                                   f"embedding {end - start} inputs of {n} tokens")
            for seq in range(end - start):
                ptr = self._lib.llama_get_embeddings_seq(self._ctx, seq)
                if not ptr:
                    raise BackendError(f"llama.cpp returned no pooled embedding for sequence {seq}")
                out[start + seq] = np.ctypeslib.as_array(ptr, shape=(self.n_embd,))
        self._lib.llama_memory_clear(self._mem, False)
        return out

    def close(self) -> None:
        """Free the context (before the model it was created over)."""
        self._context.close()
