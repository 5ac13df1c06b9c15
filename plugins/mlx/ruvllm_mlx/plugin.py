"""Entry point of the ``ruvllm`` plugin group: registers the MLX backend."""

from __future__ import annotations

from collections.abc import Callable

import ruvllm
from ruvllm.backend import LlmBackend

from ruvllm_mlx.backend import MlxBackend


@ruvllm.hookimpl
def ruvllm_register_backends(register: Callable[[type[LlmBackend]], None]) -> None:
    register(MlxBackend)
