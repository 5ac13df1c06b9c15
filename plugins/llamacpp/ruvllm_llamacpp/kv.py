"""Sequence 0 of a llama.cpp context: what is in its KV memory, and how tokens get there.

Keeping the list of tokens whose KV is stored next to the code that stores them is what makes
prefix reuse safe: the common prefix is computed against exactly what llama.cpp holds, and
everything after it is removed from the memory before the new suffix is evaluated.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from ruvllm.errors import BackendError

SEQ = 0


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class SequenceKV:
    """Evaluates tokens for one sequence and tracks the tokens held in its KV memory."""

    def __init__(self, llama_cpp: ModuleType, ctx: int, batch: Any, n_batch: int, n_vocab: int):
        self._lib = llama_cpp
        self._ctx = ctx
        self._mem = llama_cpp.llama_get_memory(ctx)
        self._batch = batch
        self._n_batch = n_batch
        self._n_vocab = n_vocab
        #: Tokens whose keys/values are in the memory, in position order.
        self.tokens: list[int] = []
        # NumPy views over the batch's C arrays: filling a chunk is a slice assignment, and a
        # decode step writes three scalars instead of going through ctypes per field.
        self._tok = np.ctypeslib.as_array(batch.token, shape=(n_batch,))
        self._pos = np.ctypeslib.as_array(batch.pos, shape=(n_batch,))
        self._want = np.ctypeslib.as_array(batch.logits, shape=(n_batch,))
        n_seq = np.ctypeslib.as_array(batch.n_seq_id, shape=(n_batch,))
        n_seq[:] = 1
        for i in range(n_batch):
            batch.seq_id[i][0] = SEQ
        self._want[:] = 0
        self._decode_fn = llama_cpp.llama_decode
        self._logits_fn = llama_cpp.llama_get_logits_ith
        self._as_array = np.ctypeslib.as_array

    def clear(self) -> int:
        """Empty the memory (metadata only: the cells are freed, the buffers not zeroed, which
        is what isolation needs and costs microseconds instead of a memset of the whole KV)."""
        self._lib.llama_memory_clear(self._mem, False)
        self.tokens.clear()
        return 0

    def reuse(self, prompt: Sequence[int]) -> int:
        """Keep the longest prefix shared with ``prompt`` (at least one prompt token is left to
        evaluate, so the last position has logits); return how many prompt tokens are kept."""
        keep = min(common_prefix_length(self.tokens, prompt), len(prompt) - 1)
        if keep <= 0:
            return self.clear()
        if keep < len(self.tokens):
            if not self._lib.llama_memory_seq_rm(self._mem, SEQ, keep, -1):
                return self.clear()  # the memory cannot drop a partial sequence (recurrent models)
            del self.tokens[keep:]
        return keep

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        """Append ``tokens`` to the sequence in chunks of n_batch; return the logits of the last
        one as a zero-copy view into llama.cpp's output buffer (valid until the next decode)."""
        n_total = len(tokens)
        if n_total == 0:
            raise BackendError("llama.cpp was asked to evaluate no tokens")
        batch = self._batch
        pos = len(self.tokens)
        if n_total == 1:
            self._tok[0] = tokens[0]
            self._pos[0] = pos
            self._want[0] = 1
            batch.n_tokens = 1
            self._call_decode(1)
        else:
            for start in range(0, n_total, self._n_batch):
                chunk = tokens[start : start + self._n_batch]
                n = len(chunk)
                self._tok[:n] = chunk
                self._pos[:n] = np.arange(pos + start, pos + start + n, dtype=self._pos.dtype)
                self._want[:n] = 0
                self._want[n - 1] = 1
                batch.n_tokens = n
                self._call_decode(n)
        self.tokens.extend(tokens)
        return self._as_array(self._logits_fn(self._ctx, -1), shape=(self._n_vocab,))

    def _call_decode(self, n: int) -> None:
        rc = self._decode_fn(self._ctx, self._batch)
        if rc != 0:
            reason = {1: "no free KV slot (context full)", 2: "aborted", -1: "invalid batch"}.get(rc, "fatal")
            raise BackendError(f"llama_decode failed with code {rc} ({reason}) on {n} tokens "
                               f"at position {len(self.tokens)}")

    def engine_tokens(self) -> int:
        """Tokens llama.cpp reports for the sequence (its highest position + 1)."""
        return int(self._lib.llama_memory_seq_pos_max(self._mem, SEQ)) + 1
