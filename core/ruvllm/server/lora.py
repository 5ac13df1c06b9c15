"""LoRA adapters over HTTP: loading and unloading named adapters on a served model.

``POST /v1/load_lora_adapter`` ``{"lora_name": ..., "lora_path": ...}`` and
``POST /v1/unload_lora_adapter`` ``{"lora_name": ...}`` have vLLM's shape. Like vLLM's
``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` they are off unless the operator opts in
(``--allow-runtime-lora`` / ``[server] allow_runtime_lora``): loading files named by a client is
a decision for whoever runs the server. They sit behind the API key like every other route.
A loaded adapter is listed by ``/v1/models`` with its base model as ``parent`` and requests pick
it with ``"model": "<adapter name>"`` (the pool turns that into ``GenerationParams.adapter``).

The adapter changes on the engine's model thread between two steps (``ServingEngine.publish``),
never in the middle of a forward pass; requests already running keep the version they started
with (the backends guarantee that), and the engine's prefix cache separates adapter versions.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from pydantic import BaseModel, ConfigDict
from starlette.exceptions import HTTPException as StarletteHTTPException

from ruvllm.adapters import AdapterHost
from ruvllm.errors import InvalidRequest, ModelError, ModelNotFound
from ruvllm.server.model_pool import ModelPool


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


class LoadLoraRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_path: str
    #: The served model the adapter is for (ruvllm's addition; default: the first one).
    model: str | None = None


class UnloadLoraRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    lora_name: str
    lora_int_id: int | None = None  # vLLM's clients may send it; names identify adapters here


def register_lora_routes(app: FastAPI, pool: ModelPool, *, allow_runtime: bool) -> None:
    lock = asyncio.Lock()  # one change at a time: a name is checked and claimed atomically

    def check_allowed() -> None:
        if not allow_runtime:
            raise StarletteHTTPException(403, "runtime LoRA updating is off on this server; start it with "
                                              "--allow-runtime-lora (or [server] allow_runtime_lora = true) "
                                              "to load and unload adapters over HTTP")

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(body: LoadLoraRequest) -> PlainTextResponse:
        check_allowed()
        name = body.lora_name.strip()
        if not name:
            raise InvalidRequest("lora_name", "must not be empty")
        async with lock:
            owner = pool.adapter_owner(name)
            reload_configured = owner is not None and name not in owner.adapters  # unloaded earlier
            if name in pool.accepted_names() and not reload_configured:
                raise InvalidRequest("lora_name", f"the name {name!r} is already served here (a model or a "
                                     "loaded adapter); unload it first or pick another name", name)
            entry = owner or (pool.default if body.model is None else pool.entry_for(body.model)[0])
            engine = await pool.engine_of(entry)
            await adapter_control(engine).load(name, body.lora_path)
            pool.add_adapter(entry, name, body.lora_path)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(body: UnloadLoraRequest) -> PlainTextResponse:
        check_allowed()
        name = body.lora_name
        async with lock:
            entry = pool.adapter_owner(name)
            if entry is None or name not in entry.adapters or entry.engine is None:
                raise ModelNotFound(f"no LoRA adapter {name!r} is loaded here (see GET /v1/models)")
            await adapter_control(entry.engine).unload(name)
            pool.remove_adapter(name)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")
