"""How LoRA adapters change on one engine: checked loading and unloading through the engine's
``AsyncEngine.adapters`` (which changes them between two steps), with the caller's mistakes as 400s.

Its own module because two parts of the server use it: the HTTP routes (``server/extensions/lora.py``) and
the model pool, which loads a model's configured adapters with it (``server/lifecycle/model_pool.py``).
In lora.py it made lora -> model_pool -> lora a cycle, which the layering check refuses.
"""

from __future__ import annotations

from pathlib import Path

from ruvllm.errors import InvalidRequest, ModelError
from ruvllm.serving import AdapterTarget, AsyncEngine


class AdapterControl:
    """Checked loading and unloading on one engine: bad paths and backend refusals are 400s."""

    def __init__(self, target: AdapterTarget):
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


def adapter_control(engine: AsyncEngine) -> AdapterControl:
    """How adapters change on ``engine``; InvalidRequest (400) when its backend has no LoRA."""
    target = engine.adapters()
    if target is not None:
        return AdapterControl(target)
    raise InvalidRequest("model", f"backend {engine.backend_name!r} has no LoRA capability, so it cannot "
                         "load adapters; serve the model with a backend that has one (candle_like, "
                         "mistralrs; see `ruvllm backends`)")
