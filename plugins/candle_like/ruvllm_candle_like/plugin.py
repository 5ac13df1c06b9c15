"""Entry point of the ``ruvllm`` plugin group: the candle_like backend and ``ruvllm convert``.

The backend module imports torch at the top (~210 MB resident), so the backend is registered
by import path: processes that serve another backend never import torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ruvllm
from ruvllm.lazy_backend import LazyBackend

#: What ``CandleLikeBackend.unavailable_reason`` imports; find_spec checks them without importing.
REQUIRES = ("torch", "gguf", "tokenizers", "safetensors")


@ruvllm.hookimpl
def ruvllm_register_backends(register: Callable[[Any], None]) -> None:
    register(LazyBackend("candle_like", "ruvllm_candle_like.backend:CandleLikeBackend",
                         formats=("gguf", "hf"), requires=REQUIRES,
                         install_hint="pip install ruvllm-candle-like",
                         fastest="ruvllm_candle_like.auto_claim:fastest_here"))


@ruvllm.hookimpl
def ruvllm_register_commands(cli: Any) -> None:
    from ruvllm_candle_like.cli import register_convert

    register_convert(cli)
