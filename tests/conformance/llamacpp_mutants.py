"""The real llama.cpp backend with one executor bug injected, to prove the engine tests catch it.

Loaded into a child conformance run as ``--ruvllm-backend llamacpp_mutants:ClassName``. Each
mutant is the shipped backend and executor except for the one method that carries the bug.
"""

from __future__ import annotations

from typing import ClassVar

from ruvllm_llamacpp import LlamaCppBackend
from ruvllm_llamacpp.executor import LlamaCppExecutor


class _StaleKvExecutor(LlamaCppExecutor):
    def free(self, seq_id: int) -> None:
        """The bug: the sequence id is handed back to the engine, its KV cells are not removed."""
        self._check_open()


class StaleKvLlamaCppBackend(LlamaCppBackend):
    """llama.cpp whose executor keeps a freed sequence's KV: the next request in that slot
    attends to the previous request's tokens."""

    name: ClassVar[str] = "llamacpp-stale-kv"

    def create_executor(self, *, max_sequences: int, block_size: int) -> LlamaCppExecutor:
        executor = super().create_executor(max_sequences=max_sequences, block_size=block_size)
        executor.__class__ = _StaleKvExecutor
        return executor
