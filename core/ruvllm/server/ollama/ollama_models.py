"""The served models as Ollama's ``/api/tags``, ``/api/ps`` and ``/api/show`` describe them.

Editors read these to offer the models, pick a context size and decide what a model can do:
names carry Ollama's tag (``name:latest``), details come from the loaded engine's
:class:`~ruvllm.types.ModelInfo` (family, parameter size, quantization), ``model_info`` gives the
context one request may use here (the model's, capped by ``--max-context``) and ``capabilities``
what this server serves on it (``tools`` on every model: guided/tools.py teaches a template
that renders none). A model the pool has not loaded yet is listed with what is known of it
without loading it (its name).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from ruvllm.errors import ModelNotFound
from ruvllm.server.lifecycle.chat_run import thinks
from ruvllm.server.lifecycle.model_pool import ModelEntry, ModelPool, ModelState, Route
from ruvllm.server.lifecycle.params import Limits


def iso_time(timestamp: float) -> str:
    """A Unix time as Ollama writes times (RFC 3339, UTC)."""
    return datetime.fromtimestamp(timestamp, timezone.utc).isoformat().replace("+00:00", "Z")


def _parameter_size(count: int | None) -> str:
    """Ollama's way of writing a parameter count: ``134.52M``, ``8.0B``."""
    if not count:
        return ""
    for unit, size, digits in (("B", 1e9, 1), ("M", 1e6, 2), ("K", 1e3, 0)):
        if count >= size:
            number = count / size
            return f"{number:.0f}{unit}" if number == int(number) else f"{number:.{digits}f}{unit}"
    return str(count)


def _weights(path: str | None) -> tuple[int, float]:
    """Bytes and modification time of a model file or directory (0, 0 when unknown)."""
    p = Path(path) if path else None
    if p is None or not p.exists():
        return 0, 0.0
    files = [p] if p.is_file() else [f for f in p.rglob("*") if f.is_file()]
    return sum(f.stat().st_size for f in files), max((f.stat().st_mtime for f in files), default=0.0)


def tag(name: str) -> str:
    """Ollama's names carry a tag (``latest`` when none was given)."""
    return name if ":" in name else f"{name}:latest"


def pool_name(pool: ModelPool, name: str) -> str:
    """The pool's name for ``name`` (Ollama's clients add ``:latest`` to a name without a tag);
    a name the pool does not serve is Ollama's 404."""
    accepted = pool.accepted_names()
    base = name.removesuffix(":latest")
    if name in accepted or base in accepted:
        return name if name in accepted else base
    served = ", ".join(repr(tag(n)) for n in pool.served_names())
    raise ModelNotFound(f"model {name!r} not found; this server serves {served} (GET /api/tags) and "
                        "downloads none: add it to [[models]] in ruvllm.toml (docs/configuration.md)")


class Catalogue:
    """What ``/api/tags``, ``/api/ps`` and ``/api/show`` say about the served models."""

    def __init__(self, pool: ModelPool, limits: Limits):
        self.pool = pool
        self.limits = limits

    def models(self) -> Iterator[tuple[str, ModelEntry]]:
        """Every model name and its entry (a LoRA adapter's entry is its base model's)."""
        for entry in self.pool.entries.values():
            yield entry.name, entry
            for adapter in {**entry.spec.adapters, **entry.adapters}:
                yield adapter, entry

    def details(self, name: str, entry: ModelEntry) -> dict[str, Any]:
        """``/api/tags``' entry of model ``name`` (``entry``'s, or one of its adapters): what
        the loaded engine tells, blanks for a model not loaded yet."""
        info = entry.engine.info if entry.engine is not None else None
        path = info.path if info is not None else None
        size, mtime = _weights(path)
        modified = iso_time(mtime) if mtime else None
        # An identity of the served file, not a hash of its bytes: hashing gigabytes of weights
        # would stall a listing. It changes when the file does.
        digest = hashlib.sha256(f"{name}\n{path}\n{size}\n{mtime}".encode()).hexdigest()
        details = {"parent_model": entry.name if name != entry.name else "",
                   "format": ("gguf" if path.endswith(".gguf") else "safetensors") if path else "",
                   "family": info.architecture if info else "",
                   "families": [info.architecture] if info else None,
                   "parameter_size": _parameter_size(info.parameters) if info else "",
                   "quantization_level": (info.quantization or "") if info else ""}
        return {"name": tag(name), "model": tag(name), "size": size, "digest": digest,
                "modified_at": modified, "details": details}

    def running(self) -> list[dict[str, Any]]:
        """``/api/ps``: the loaded models (their adapters run on them), with when an idle one
        unloads and the context one request may use."""
        out = []
        for entry in self.pool.entries.values():
            if entry.state is not ModelState.LOADED or entry.engine is None:
                continue
            model = self.details(entry.name, entry)
            keep = entry.keep_alive
            # The pool's clock is time.monotonic: an idle model is unloaded keep_alive after its last use.
            left = None if keep is None else max(0.0, entry.last_used + keep - time.monotonic())
            model.update(
                expires_at=None if left is None else iso_time(time.time() + left),
                # Ollama's bytes in GPU memory: the whole model on a GPU backend, none on the CPU.
                size_vram=model["size"] if entry.engine.capabilities.device != "cpu" else 0,
                context_length=self.limits.context_length(entry.engine.info.context_length))
            del model["modified_at"]
            out.append(model)
        return out

    def show(self, route: Route) -> dict[str, Any]:
        """``/api/show``: the listing's details, the chat template, ``model_info`` and
        ``capabilities`` of the model ``route`` serves."""
        info = route.engine.info
        entry = self.pool.entries[route.entry]
        listed = self.details(route.served_name, entry)
        capabilities = ["completion", "tools"]  # tools on every model (guided/tools.py)
        if route.engine.capabilities.embeddings:
            capabilities.append("embedding")
        if thinks(route, self.limits):  # Ollama's CLI and UIs offer `think` on these alone
            capabilities.append("thinking")
        model_info: dict[str, Any] = {"general.architecture": info.architecture,
                                      f"{info.architecture}.context_length":
                                          self.limits.context_length(info.context_length),
                                      f"{info.architecture}.vocab_size": info.vocab_size}
        if info.parameters:
            model_info["general.parameter_count"] = info.parameters
        return {"template": info.chat_template or "", "details": listed["details"], "model_info": model_info,
                "capabilities": capabilities, "modified_at": listed["modified_at"]}
