"""How LoRA adapters change on one engine: checked loading and unloading, between two steps.

The adapter changes on the engine's model thread between two steps (``ServingEngine.publish``),
never in the middle of a forward pass; requests already running keep the version they started
with (the backends guarantee that), and the engine's prefix cache separates adapter versions.

Its own module because two parts of the server use it: the HTTP routes (``server/lora.py``) and
the model pool, which loads a model's configured adapters with it (``server/model_pool.py``).
In lora.py it made lora -> model_pool -> lora a cycle, which the layering check refuses.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from ruvllm.adapters import AdapterHost
from ruvllm.errors import InvalidRequest, ModelError


class _PublishedAdapters:
    """A ServingEngine's backend adapters, changed between steps through ``engine.publish``."""

    def __init__(self, engine: Any, backend: Any):
        self.engine = engine
        self.backend = backend

    def adapter_names(self) -> tuple[str, ...]:
        return tuple(self.backend.adapter_names())

    async def load_adapter_async(self, name: str, path: str) -> None:
        await asyncio.wrap_future(self.engine.publish(lambda: self.backend.load_adapter(name, path)))

    async def unload_adapter_async(self, name: str) -> None:
        await asyncio.wrap_future(self.engine.publish(lambda: self.backend.unload_adapter(name)))


class AdapterControl:
    """Checked loading and unloading on one engine: bad paths and backend refusals are 400s."""

    def __init__(self, target: _PublishedAdapters):
        self.target = target

    async def load(self, name: str, path: str) -> None:
        if not Path(path).expanduser().exists():
            raise InvalidRequest("lora_path", f"{path!r} does not exist on the server; give the path of a "
                                 "PEFT LoRA directory (adapter_config.json, adapter_model.safetensors)", path)
        try:
            await self.target.load_adapter_async(name, str(Path(path).expanduser()))
        except ModelError as exc:  # unreadable or incompatible adapter files: the caller's to fix
            raise InvalidRequest("lora_path", f"cannot load adapter {name!r}: {exc}", path) from exc

    async def unload(self, name: str) -> None:
        await self.target.unload_adapter_async(name)


def adapter_control(engine: Any) -> AdapterControl:
    """How adapters change on ``engine``; InvalidRequest (400) when its backend has no LoRA."""
    backend = getattr(engine, "backend", None)
    if (backend is not None and hasattr(engine, "publish") and isinstance(backend, AdapterHost)
            and hasattr(backend, "load_adapter") and engine.capabilities.lora):
        return AdapterControl(_PublishedAdapters(engine, backend))
    raise InvalidRequest("model", f"backend {engine.backend_name!r} has no LoRA capability, so it cannot "
                         "load adapters; serve the model with a backend that has one (candle_like, "
                         "mistralrs; see `ruvllm backends`)")
