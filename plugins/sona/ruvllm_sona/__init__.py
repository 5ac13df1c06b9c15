"""SONA for ruvllm: the model learns from its users' feedback while it serves.

>>> from ruvllm.engine import ServingEngine
>>> import ruvllm_sona
>>> engine = ServingEngine(backend)                  # a candle_like backend
>>> sona = ruvllm_sona.attach(engine, ruvllm_sona.SonaOptions(interval=2.0))
>>> handle = engine.submit_sync(ids, params); result = handle.result()
>>> engine.feedback(handle.request_id, 1.0)          # or POST /v1/feedback

See docs/sona.md.

``Sona`` and ``SonaOptions`` import torch, and plugin discovery imports this package in every
ruvllm process (its entry point is ``ruvllm_sona.plugin``): they are imported on first access.
"""

import importlib
from typing import Any

from ruvllm_sona.plugin import attach, detach, sona_for

__all__ = ["Sona", "SonaOptions", "attach", "detach", "sona_for"]

_LAZY = {"Sona": "ruvllm_sona.controller", "SonaOptions": "ruvllm_sona.options"}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_LAZY[name]), name)
