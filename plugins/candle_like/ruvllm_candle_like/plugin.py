"""Entry point of the ``ruvllm`` plugin group: the candle_like backend and ``ruvllm convert``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import ruvllm
from ruvllm.backend import LlmBackend


@ruvllm.hookimpl
def ruvllm_register_backends(register: Callable[[type[LlmBackend]], None]) -> None:
    from ruvllm_candle_like.backend import CandleLikeBackend

    register(CandleLikeBackend)


@ruvllm.hookimpl
def ruvllm_register_commands(cli: Any) -> None:
    from ruvllm_candle_like.cli import register_convert

    register_convert(cli)
