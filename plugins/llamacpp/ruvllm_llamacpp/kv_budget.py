"""How much KV memory the llama.cpp executor allocates: the ``kv_budget_mib`` option.

llama.cpp allocates and zeroes every sequence's whole KV stream when the context is created, so
the executor's KV is resident from start-up, busy or idle. Sizing each of the engine's
sequences at ``n_ctx`` made ``ruvllm serve`` on the embedded 85 MB model hold 1.6 GiB of KV
(16 running + 2 prefix-donor sequences x 4096 tokens x 22.5 KiB) in a 2.1 GB process. The
executor's KV therefore comes from a stated budget: every sequence gets the most tokens the
budget allows, capped at ``n_ctx``, and the result is logged and printed by ``ruvllm serve``
with what it would take to give every sequence the full window.
"""

from __future__ import annotations

from types import ModuleType

import attrs
from ruvllm.errors import InvalidRequest

MIB = 1 << 20
#: llama.cpp pads a sequence's KV stream (``n_ctx_seq``) up to a multiple of 256 cells: a plan
#: in whole multiples is exactly what gets allocated.
CELL_GRANULARITY = 256
_F16_BYTES = 2


def kv_bytes_per_token(llama_cpp: ModuleType, model: int, metadata: dict[str, str]) -> int:
    """Bytes of f16 keys and values one token takes over every layer (llama.cpp's default KV
    type); GGUF's ``<arch>.attention.key_length`` / ``value_length`` override ``n_embd / n_head``."""
    arch = metadata.get("general.architecture", "")
    n_head = int(llama_cpp.llama_model_n_head(model))
    head_dim = int(llama_cpp.llama_model_n_embd(model)) // n_head if n_head > 0 else 0
    k_dim = int(metadata.get(f"{arch}.attention.key_length") or head_dim)
    v_dim = int(metadata.get(f"{arch}.attention.value_length") or head_dim)
    n_kv = int(llama_cpp.llama_model_n_head_kv(model))
    return int(llama_cpp.llama_model_n_layer(model)) * n_kv * (k_dim + v_dim) * _F16_BYTES


@attrs.frozen(kw_only=True)
class KvPlan:
    """The executor's KV: ``sequences`` streams of ``tokens`` cells each."""

    tokens: int
    sequences: int
    bytes_per_token: int
    #: The budget it was planned under (0: none, every sequence gets ``n_ctx``).
    budget_mib: int
    #: The backend's window, and how many sequences the engine asked for.
    n_ctx: int
    asked_sequences: int

    @property
    def total_bytes(self) -> int:
        return self.tokens * self.sequences * self.bytes_per_token

    @property
    def over_budget(self) -> bool:
        return self.budget_mib > 0 and self.total_bytes > self.budget_mib * MIB

    def describe(self) -> str:
        """One line for the log and the ``ruvllm serve`` banner."""
        line = (f"KV cache: {self.tokens} tokens x {self.sequences} sequences = "
                f"{self.total_bytes / MIB:.1f} MiB")
        if self.budget_mib == 0:
            return line + " (kv_budget_mib = 0: no budget, n_ctx for every sequence)"
        line += f" (kv_budget_mib = {self.budget_mib}"
        if self.over_budget:
            line += f", exceeded: a sequence takes at least {CELL_GRANULARITY} tokens"
        if self.sequences < self.asked_sequences:
            line += f"; only {self.sequences} of the {self.asked_sequences} sequences asked for fit"
        if self.tokens < self.n_ctx:
            full = -(-self.n_ctx * self.asked_sequences * self.bytes_per_token // MIB)
            line += (f"; a request gets {self.tokens} of the {self.n_ctx}-token window, "
                     f"kv_budget_mib = {full} gives every sequence all of it")
        return line + ")"


def plan_kv(*, n_ctx: int, sequences: int, bytes_per_token: int, budget_mib: int) -> KvPlan:
    """Tokens per sequence for ``sequences`` sequences within ``budget_mib``, capped at ``n_ctx``.

    Sequences come first (they are the engine's concurrency): only when the budget cannot give
    each of them the smallest stream llama.cpp allocates are there fewer, at least one.
    """
    if sequences < 1:
        raise InvalidRequest("max_sequences", f"must be >= 1, got {sequences}", sequences)
    plan = KvPlan(tokens=n_ctx, sequences=sequences, bytes_per_token=bytes_per_token,
                  budget_mib=budget_mib, n_ctx=n_ctx, asked_sequences=sequences)
    if not plan.over_budget:  # also: no budget (0)
        return plan
    budget = budget_mib * MIB
    tokens = budget // (sequences * bytes_per_token) // CELL_GRANULARITY * CELL_GRANULARITY
    if tokens >= CELL_GRANULARITY:  # below n_ctx, or n_ctx itself would have fitted
        return attrs.evolve(plan, tokens=tokens)
    smallest = min(n_ctx, CELL_GRANULARITY)
    fit = max(1, budget // (smallest * bytes_per_token))
    return attrs.evolve(plan, tokens=smallest, sequences=min(sequences, fit))
