"""Named LoRA adapters on a loaded backend: the contract core relies on, and the submit-time check.

A backend with ``Capabilities.lora`` keeps named adapters and implements :class:`AdapterHost`.
Core checks a request's ``GenerationParams.adapter`` against it *before* the request is queued,
so an unknown name is an :class:`~ruvllm.errors.InvalidRequest` for that caller and never a
failure in the middle of a batched step shared with other requests.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from ruvllm.errors import InvalidRequest


@runtime_checkable
class AdapterHost(Protocol):
    def adapter_names(self) -> tuple[str, ...]:
        """Names new requests may ask for."""
        ...

    def adapter_revision(self, name: str) -> int:
        """Grows with every change of ``name`` (load, update, unload); InvalidRequest (field
        ``adapter``) when ``name`` is not loaded."""
        ...


def adapter_cache_key(backend: object, name: str | None) -> str | None:
    """Validate ``name`` against ``backend`` and return the key that separates its prefix-cache
    entries (name and revision: KV computed with another adapter, or an older version of
    this one, is never reused). None for the base model."""
    if name is None:
        return None
    if not isinstance(backend, AdapterHost) or not backend.capabilities().lora:  # type: ignore[attr-defined]
        backend_name = getattr(backend, "name", type(backend).__name__)
        raise InvalidRequest("adapter", f"backend {backend_name!r} has no LoRA capability; drop 'adapter' "
                             "or serve with a backend that has one (candle_like, mistralrs)", name)
    return f"{name}@{backend.adapter_revision(name)}"
