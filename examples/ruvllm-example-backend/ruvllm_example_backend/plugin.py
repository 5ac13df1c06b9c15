"""Entry point of the ``ruvllm`` plugin group: registers the example backend by import path.

Every ruvllm process loads this module, so it imports nothing heavy: the backend module (which
imports llama_cpp) is imported only when the backend is selected, listed or loaded.
"""

from __future__ import annotations

from collections.abc import Callable

import ruvllm
from ruvllm.lazy_backend import LazyBackend


@ruvllm.hookimpl
def ruvllm_register_backends(register: Callable[[LazyBackend], None]) -> None:
    register(LazyBackend(
        "example", "ruvllm_example_backend.backend:ExampleBackend", formats=("gguf",),
        requires=("llama_cpp",), install_hint="pip install llama-cpp-python",
    ))
