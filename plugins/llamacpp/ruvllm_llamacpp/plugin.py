"""Entry point of the ``ruvllm`` plugin group: registers the llama.cpp backend."""

from __future__ import annotations

from collections.abc import Callable

import ruvllm
from ruvllm.backend import LlmBackend

from ruvllm_llamacpp.backend import LlamaCppBackend


@ruvllm.hookimpl
def ruvllm_register_backends(register: Callable[[type[LlmBackend]], None]) -> None:
    register(LlamaCppBackend)
