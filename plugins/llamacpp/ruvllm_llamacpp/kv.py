"""Sequence 0 of a llama.cpp context: what is in its KV memory, and how tokens get there.

Keeping the list of tokens whose KV is stored next to the code that stores them is what makes
prefix reuse safe: the common prefix is computed against exactly what llama.cpp holds, and
everything after it is removed from the memory before the new suffix is evaluated.

llama.cpp evaluates a batch of one token with other kernels than a batch of several (its decode
path), and the two round differently: the same position's logits differ by up to 0.53 (measured
on the AVX-512 build here, prompts of 39-700 tokens, flash attention off), while any split into
batches of two or more tokens gives the same bits. So prompt tokens are never evaluated one at a
time when the prompt has more (:data:`MIN_PROMPT_BATCH`, :func:`prompt_chunks`): a reused prefix
that a previous *prefill* computed then holds exactly the KV a fresh prefill would. Tokens a
previous call *generated* went through the one-token path, so a prefix containing them (a chat's
earlier answer) matches a fresh prefill only up to that rounding (docs/backends/llamacpp.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

import numpy as np
from ruvllm.errors import BackendError
from ruvllm.tokenizer import common_prefix

SEQ = 0
#: Fewest prompt tokens evaluated in one llama_decode when the prompt has that many (see above).
MIN_PROMPT_BATCH = 2


def prompt_chunks(n_total: int, n_batch: int) -> list[tuple[int, int]]:
    """``(start, end)`` of each llama_decode for ``n_total`` tokens: ``n_batch`` at a time, except
    that a last chunk of one token takes one more from the chunk before it, so that no token of a
    multi-token evaluation goes through llama.cpp's one-token kernels (when n_batch allows)."""
    bounds = [(s, min(s + n_batch, n_total)) for s in range(0, n_total, n_batch)]
    if len(bounds) > 1 and bounds[-1][1] - bounds[-1][0] < MIN_PROMPT_BATCH and n_batch > MIN_PROMPT_BATCH:
        (start, cut), (_, end) = bounds[-2], bounds[-1]
        bounds[-2:] = [(start, cut - 1), (cut - 1, end)]
    return bounds


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
        """Keep the longest prefix shared with ``prompt``; return how many prompt tokens are kept.

        At least :data:`MIN_PROMPT_BATCH` prompt tokens are left to evaluate (the last position
        needs logits, and one token alone would take llama.cpp's one-token kernels, which round
        differently from the prefill a fresh call runs)."""
        keep = min(common_prefix(self.tokens, prompt), len(prompt) - MIN_PROMPT_BATCH)
        if keep <= 0:
            return self.clear()
        if keep < len(self.tokens):
            if not self._lib.llama_memory_seq_rm(self._mem, SEQ, keep, -1):
                return self.clear()  # the memory cannot drop a partial sequence (recurrent models)
            del self.tokens[keep:]
        return keep

    def decode(self, tokens: Sequence[int]) -> np.ndarray:
        """Append ``tokens`` to the sequence in chunks of n_batch (:func:`prompt_chunks`); return the
        logits of the last one as a zero-copy view into llama.cpp's output buffer (valid until the
        next decode)."""
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
            for start, end in prompt_chunks(n_total, self._n_batch):
                chunk = tokens[start:end]
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
