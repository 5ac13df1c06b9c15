"""LoRA adapters over HTTP: loading and unloading named adapters on a served model.

``POST /v1/load_lora_adapter`` ``{"lora_name": ..., "lora_path": ...}`` and
``POST /v1/unload_lora_adapter`` ``{"lora_name": ...}`` have vLLM's shape. Like vLLM's
``VLLM_ALLOW_RUNTIME_LORA_UPDATING`` they are off unless the operator opts in
(``--allow-runtime-lora`` / ``[server] allow_runtime_lora``): loading files named by a client is
a decision for whoever runs the server. They sit behind the API key like every other route.
A loaded adapter is listed by ``/v1/models`` with its base model as ``parent`` and requests pick
it with ``"model": "<adapter name>"`` (the pool turns that into ``GenerationParams.adapter``).

How an adapter changes on an engine (between two steps) is :mod:`ruvllm.server.lifecycle.adapter_control`,
which the model pool uses too when it loads a model's configured adapters.
"""

from __future__ import annotations

import asyncio

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ruvllm.errors import InvalidRequest, ModelNotFound
from ruvllm.server.http.strict_fields import RequestBody
from ruvllm.server.lifecycle.adapter_control import adapter_control
from ruvllm.server.lifecycle.model_pool import ModelPool


class LoadLoraRequest(RequestBody):

    lora_name: str
    lora_path: str
    #: The served model the adapter is for (ruvllm's addition; default: the first one).
    model: str | None = None


class UnloadLoraRequest(RequestBody):

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
