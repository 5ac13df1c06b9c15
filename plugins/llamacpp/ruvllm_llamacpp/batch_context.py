"""A llama.cpp context with its token batch, over a model the backend already loaded.

The engine's executor and the embeddings context each own one; they differ only in their
parameters (sequences, unified KV, pooling), so creating the context, viewing the batch's C
arrays from NumPy and freeing both once live here.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

import numpy as np
from ruvllm.errors import BackendError


class BatchContext:
    """``n_ctx`` cells in ``n_seq_max`` sequences and a batch of ``n_batch`` tokens, each token in
    one sequence. ``pooling`` (a ``LLAMA_POOLING_TYPE_*``) turns on embeddings mode; ``type_k`` /
    ``type_v`` (``GGML_TYPE_*``) set the KV cell types (None: llama.cpp's f16); ``n_ubatch`` the
    rows of a micro-batch (None: the whole batch); ``failure`` is the message when llama.cpp
    cannot create the context (what to lower)."""

    def __init__(self, llama_cpp: ModuleType, model: Any, *, n_ctx: int, n_batch: int, n_seq_max: int,
                 kv_unified: bool, n_threads: int, flash_attn: bool, failure: str,
                 pooling: int | None = None, type_k: int | None = None, type_v: int | None = None,
                 n_ubatch: int | None = None):
        self.lib = llama_cpp
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_ubatch or n_batch, n_batch)
        cparams.n_seq_max = n_seq_max
        # llama.cpp reserves a logits row for every sequence (output_reserve: max(outputs,
        # n_seq_max)) but caps the rows at n_outputs_max, n_batch by default: more sequences than
        # batch tokens (`-o n_batch=32` beside 64 sequences) tripped GGML_ASSERT(n_outputs_max <=
        # cparams.n_outputs_max) and aborted the process. A step never has more outputs than
        # tokens, so room for one row a sequence costs only the rows' reservation.
        cparams.n_outputs_max = max(min(n_batch, n_ctx), n_seq_max)
        cparams.kv_unified = kv_unified
        if type_k is not None:
            cparams.type_k = type_k
        if type_v is not None:
            cparams.type_v = type_v
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.embeddings = pooling is not None
        if pooling is not None:
            cparams.pooling_type = pooling
        cparams.no_perf = True
        cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn
                                   else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise BackendError(failure)
        self.ctx = ctx
        self.mem = llama_cpp.llama_get_memory(ctx)
        self.batch = llama_cpp.llama_batch_init(n_batch, 0, 1)
        b = self.batch
        # NumPy views over the batch's C arrays: filling a batch is a few slice assignments.
        self.tokens = np.ctypeslib.as_array(b.token, shape=(n_batch,))
        self.positions = np.ctypeslib.as_array(b.pos, shape=(n_batch,))
        self.wants_output = np.ctypeslib.as_array(b.logits, shape=(n_batch,))
        np.ctypeslib.as_array(b.n_seq_id, shape=(n_batch,))[:] = 1
        self.seq_ptrs = [b.seq_id[i] for i in range(n_batch)]
        self.closed = False

    def close(self) -> None:
        """Free the batch and the context (before the model they were created over); once."""
        if self.closed:
            return
        self.closed = True
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
