"""The ``[backends.llamacpp]`` options, validated before any model file is touched.

Options arrive from TOML or ``--option KEY=VALUE`` as loosely typed values; a wrong one must
fail with the option's name and the accepted range (``ruvllm.errors.BackendOptionError``), not
deep inside llama.cpp (where a bad ``n_ctx`` or ``n_batch`` aborts the process or silently falls
back to another value).
"""

from __future__ import annotations

from typing import ClassVar

import attrs
from ruvllm.hardware import usable_cpus
from ruvllm.options import accepts, any_of, boolean, int_range, is_int, one_of, positive_int

from ruvllm_llamacpp.kv_pool import FLASH_ATTN, KV_TYPES

#: Smallest context llama.cpp is useful with; below it a prompt plus one token hardly fits.
MIN_CTX = 16

_n_ctx = accepts(
    f"an integer of at least {MIN_CTX} (or 0 for the model's training context)",
    lambda v: is_int(v) and (v == 0 or v >= MIN_CTX),
)


@attrs.frozen(kw_only=True)
class LlamaCppOptions:
    """Options of the llama.cpp backend; see docs/backends/llamacpp.md.

    Parse a ``[backends.llamacpp]`` table with ``ruvllm.options.parse_options``.
    """

    BACKEND: ClassVar[str] = "llamacpp"

    #: Context window in tokens: the most one request may use (prompt + output), capped at the
    #: model's training context. 0 (the default) = that context.
    n_ctx: int = attrs.field(default=0, validator=_n_ctx)
    #: Threads for decoding and prompt processing.
    n_threads: int = attrs.field(factory=usable_cpus, validator=positive_int())
    #: Prompt tokens evaluated per llama_decode call (prefill chunk), capped at n_ctx.
    n_batch: int = attrs.field(default=512, validator=positive_int())
    #: Layers offloaded to the GPU (-1 = all); needs a GPU build of llama-cpp-python.
    n_gpu_layers: int = attrs.field(default=0, validator=int_range(-1, note="-1 offloads every layer"))
    #: Keep the KV of the previous call and re-evaluate only the part of a new prompt that
    #: differs from it. Off by default: every call then starts from an empty KV.
    prefix_reuse: bool = attrs.field(default=False, validator=boolean())
    #: llama.cpp's flash attention kernels: "auto" (the default: on for the executor's shared
    #: KV pool, whose other requests' cells only these kernels skip, faster with many requests
    #: and on long prompts; off for generate()'s single sequence, as llama-cpp-python has it),
    #: "on" / true, or "off" / false. A quantised V cache turns it on.
    flash_attn: bool | str = attrs.field(default="auto", validator=any_of(boolean(), one_of(FLASH_ATTN)))
    #: MiB of the ServingEngine executor's KV pool (resident from start-up), shared by every
    #: request (see kv_pool.py). 256 gives the embedded model 11,520 tokens: one request may use
    #: its whole 8,192-token context, and ``ruvllm serve`` stays under 500 MB resident.
    kv_budget_mib: int = attrs.field(default=256, validator=int_range(
        0, note="0: n_ctx for every running request"))
    #: Keep cached prefixes (finished requests kept for a later prefix-cache hit) in host memory
    #: instead of the KV pool, so the pool holds running requests only: a step then attends over
    #: their cells alone, and a request repeated on an idle server lands where it did before and
    #: computes the same logits (see parked.py). Costs host memory up to the cached prefixes' KV,
    #: at most the pool's size.
    park_prefixes: bool = attrs.field(default=True, validator=boolean())
    #: Cell types of the keys and values (llama.cpp's type_k / type_v): q8_0 halves the bytes per
    #: token of f16, q4_0 takes 28 %; a quantised V turns flash attention on (llama.cpp needs it).
    type_k: str = attrs.field(default="f16", validator=one_of(tuple(KV_TYPES)))
    type_v: str = attrs.field(default="f16", validator=one_of(tuple(KV_TYPES)))
    #: Tokens of the embeddings context (/v1/embeddings; created on first use): the longest input
    #: and the most tokens one embeddings batch holds. Its compute buffer keeps logits for every
    #: token: about embedding_tokens x n_vocab x 4 bytes (96 MiB at 512 for the embedded model).
    embedding_tokens: int = attrs.field(default=512, validator=int_range(MIN_CTX))
    #: Let llama.cpp print its load and performance logs to stderr.
    verbose: bool = attrs.field(default=False, validator=boolean())
