"""A ServingEngine's backend adapters, changed between two steps (implements
:class:`ruvllm.serving.AdapterTarget`).

The change runs on the engine's model thread through ``ServingEngine.publish``, never in the
middle of a forward pass; requests already running keep the version they started with (the
backends guarantee that), and the engine's prefix cache separates adapter versions by revision.
"""

from __future__ import annotations

import asyncio
from typing import Any


class PublishedAdapters:
    def __init__(self, engine: Any, backend: Any):
        self._engine = engine
        self._backend = backend

    def adapter_names(self) -> tuple[str, ...]:
        return tuple(self._backend.adapter_names())

    async def load_adapter_async(self, name: str, path: str) -> None:
        await asyncio.wrap_future(self._engine.publish(lambda: self._backend.load_adapter(name, path)))

    async def unload_adapter_async(self, name: str) -> None:
        await asyncio.wrap_future(self._engine.publish(lambda: self._backend.unload_adapter(name)))
