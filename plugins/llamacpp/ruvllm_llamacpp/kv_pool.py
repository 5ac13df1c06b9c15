"""The llama.cpp executor's KV pool: one unified buffer, sized by ``kv_budget_mib``.

llama.cpp allocates and zeroes a context's whole KV buffer when the context is created, so the
executor's KV is resident from start-up, busy or idle: its size is a memory decision, stated
once here and printed by ``ruvllm serve``. The buffer is *unified* (``kv_unified``): every
sequence takes cells from the one pool as it grows, so a request may use the model's whole
context while the pool has room, and the engine's block manager (which accounts the same cells
in blocks) queues or preempts when it has none. The earlier design gave each sequence a fixed
slice (18 x 512 tokens within the same 256 MiB) and refused every request longer than a slice.

Cell types are llama.cpp's ``type_k`` / ``type_v``: f16 (its default), q8_0 or q4_0. A quantised
V cache needs flash attention, which the backend then turns on (and says so).

Flash attention for the pool (``flash_attn = "auto"``, the default, as llama-server's on a CPU):
in a unified buffer each token's attention spans every cell in use, its own sequence's and all
the others' (masked), and only llama.cpp's flash-attention kernel skips the masked cells; without
it a step of 16 sequences costs as if each attended to all 16 (0.59-0.75x the throughput of
per-sequence streams, docs/engine.md). Its kernels round a row differently in a micro-batch of
64 rows or more (tiled) than in a smaller one (per row), so a prefix-cache hit, which recomputes
only a prompt's last rows, would move a repeated request's logits; the executor therefore asks
the engine to prefill those rows in a step of their own (``split_prompt_tail``), and parks
prefix donors out of the pool, so a greedy request repeated on an idle server computes the same
logits bit for bit (tests/engine/test_engine_llamacpp.py).
"""

from __future__ import annotations

from types import ModuleType

import attrs
from ruvllm.errors import BackendOptionError, InvalidRequest

MIB = 1 << 20
#: llama.cpp pads a context's cell count up to a multiple of 256: a pool in whole multiples is
#: exactly what gets allocated.
CELL_GRANULARITY = 256
#: Sequence ids one llama.cpp context may hold (``LLAMA_MAX_SEQ`` in src/llama-cparams.h).
LLAMA_MAX_SEQ = 256


#: Values of the ``flash_attn`` option besides true / false (llama-server's ``--flash-attn``).
FLASH_ATTN = ("auto", "on", "off")


def flash_attn_enabled(option: bool | str, *, shared_pool: bool, type_v: str) -> bool:
    """Whether a context runs llama.cpp's flash attention: as ``option`` says ("on"/true,
    "off"/false), or under "auto" for a pool shared by several sequences only; a quantised V
    cache always (llama.cpp refuses it otherwise)."""
    if KV_TYPES[type_v].quantized or option in (True, "on"):
        return True
    return option == "auto" and shared_pool


@attrs.frozen
class KvType:
    """One llama.cpp KV cell type: its ``GGML_TYPE_*`` id and storage (bytes per block of
    ``block`` elements)."""

    name: str
    ggml_type: int
    block_bytes: int
    block: int

    @property
    def quantized(self) -> bool:
        return self.block > 1

    def row_bytes(self, elements: int, option: str) -> int:
        if elements % self.block:
            raise BackendOptionError("llamacpp", option, f"{self.name} stores {self.block} values per "
                                     f"block, but this model's heads have {elements}; use f16", self.name)
        return elements // self.block * self.block_bytes


#: The cell types offered (ggml's ids and sizes: ggml/src/ggml.c type_traits).
KV_TYPES = {t.name: t for t in (KvType("f16", 1, 2, 1), KvType("q8_0", 8, 34, 32), KvType("q4_0", 2, 18, 32))}


def kv_bytes_per_token(llama_cpp: ModuleType, model: int, metadata: dict[str, str], *,
                       type_k: str = "f16", type_v: str = "f16") -> int:
    """Bytes of keys and values one token takes over every layer in the given cell types;
    GGUF's ``<arch>.attention.key_length`` / ``value_length`` override ``n_embd / n_head``."""
    arch = metadata.get("general.architecture", "")
    n_head = int(llama_cpp.llama_model_n_head(model))
    head_dim = int(llama_cpp.llama_model_n_embd(model)) // n_head if n_head > 0 else 0
    k_dim = int(metadata.get(f"{arch}.attention.key_length") or head_dim)
    v_dim = int(metadata.get(f"{arch}.attention.value_length") or head_dim)
    n_kv = int(llama_cpp.llama_model_n_head_kv(model))
    per_head = KV_TYPES[type_k].row_bytes(k_dim, "type_k") + KV_TYPES[type_v].row_bytes(v_dim, "type_v")
    return int(llama_cpp.llama_model_n_layer(model)) * n_kv * per_head


@attrs.frozen(kw_only=True)
class KvPool:
    """``tokens`` cells shared by every sequence; one request may use ``per_request`` of them."""

    tokens: int
    bytes_per_token: int
    #: The budget it was planned under (0: none, every running request gets ``n_ctx``).
    budget_mib: int
    #: The backend's context window: the most one request may use when the pool allows.
    n_ctx: int
    type_k: str = "f16"
    type_v: str = "f16"
    #: llama.cpp's flash attention for the pool's context (see flash_attn_enabled).
    flash_attn: bool = False

    @property
    def total_bytes(self) -> int:
        return self.tokens * self.bytes_per_token

    @property
    def per_request(self) -> int:
        return min(self.n_ctx, self.tokens)

    @property
    def over_budget(self) -> bool:
        return self.budget_mib > 0 and self.total_bytes > self.budget_mib * MIB

    def describe(self) -> str:
        """One line for the log and the ``ruvllm serve`` banner."""
        kinds = self.type_k if self.type_k == self.type_v else f"K {self.type_k}, V {self.type_v}"
        line = (f"KV pool: {self.tokens} tokens x {self.bytes_per_token / 1024:.2f} KiB ({kinds}) = "
                f"{self.total_bytes / MIB:.1f} MiB, shared by all requests; one request may use "
                f"{self.per_request} tokens")
        if KV_TYPES[self.type_v].quantized:
            line += ", flash attention on (a quantised V cache needs it)"
        elif self.flash_attn:
            line += ", flash attention on"
        if self.budget_mib == 0:
            return line + " (kv_budget_mib = 0: no budget, n_ctx for every running request)"
        line += f" (kv_budget_mib = {self.budget_mib}"
        if self.over_budget:
            line += f", exceeded: the pool holds at least {CELL_GRANULARITY} tokens"
        if self.per_request < self.n_ctx:
            need = -(-self.n_ctx * self.bytes_per_token // MIB)
            line += (f"; the model's context is {self.n_ctx} tokens, kv_budget_mib = {need} "
                     "lets one request use all of it")
        return line + ")"


def plan_pool(*, n_ctx: int, sequences: int, bytes_per_token: int, budget_mib: int,
              type_k: str = "f16", type_v: str = "f16", flash_attn: bool | str = "off") -> KvPool:
    """The most cells ``budget_mib`` holds, in whole 256-cell blocks, at least one block and no
    more than ``sequences`` full windows (more could never be used); with no budget (0),
    ``sequences`` full windows."""
    if sequences < 1:
        raise InvalidRequest("max_sequences", f"must be >= 1, got {sequences}", sequences)
    windows = _round_up(n_ctx * sequences)
    tokens = windows
    if budget_mib > 0:
        fit = budget_mib * MIB // bytes_per_token // CELL_GRANULARITY * CELL_GRANULARITY
        tokens = min(windows, max(fit, CELL_GRANULARITY))
    return KvPool(tokens=tokens, bytes_per_token=bytes_per_token, budget_mib=budget_mib, n_ctx=n_ctx,
                  type_k=type_k, type_v=type_v,
                  flash_attn=flash_attn_enabled(flash_attn, shared_pool=sequences > 1, type_v=type_v))


def _round_up(tokens: int) -> int:
    return -(-tokens // CELL_GRANULARITY) * CELL_GRANULARITY
