"""Plugin discovery, the backend registry and backend selection.

Plugins are found through the ``ruvllm`` entry-point group. Each entry point is loaded on its
own so that one broken plugin cannot hide the others, and every failure is recorded with its
reason: a plugin that silently vanishes is the bug users of other runtimes report most.

Discovery runs in every ruvllm process, so it must stay light: a plugin whose backend module
imports its engine at the top registers a :class:`~ruvllm.lazy_backend.LazyBackend`, and the
class (with its engine) is imported only when it is selected, listed or loaded.
"""

from __future__ import annotations

import logging
import os
import platform
import sys
import traceback
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path

import attrs
import pluggy

from ruvllm import hookspecs
from ruvllm.auto_backend import Preference, measured_preference
from ruvllm.backend import LlmBackend
from ruvllm.errors import BackendUnavailable, UnknownBackend
from ruvllm.lazy_backend import LazyBackend
from ruvllm.models import ModelSource
from ruvllm.native_probe import crash_reason

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "ruvllm"
#: Comma-separated entry-point names to load; unset loads every installed plugin.
ALLOWLIST_ENV = "RUVLLM_PLUGINS"

#: ``backend = "auto"`` tries these in order, first available one that reads the model wins,
#: unless ``ruvllm tune`` measured this machine (ruvllm.auto_backend).
#: Apple Silicon: MLX runs on the Metal GPU. Elsewhere llama.cpp is the fastest CPU engine
#: measured here; the PyTorch reference comes next; mistral.rs is slower on CPU.
AUTO_PREFERENCE = {
    "darwin-arm64": ("mlx", "llamacpp", "candle_like", "mistralrs"),
    "default": ("llamacpp", "candle_like", "mlx", "mistralrs"),
}


def platform_key() -> str:
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "darwin-arm64"
    return "default"


@attrs.define
class PluginFailure:
    plugin: str
    reason: str
    detail: str = ""


#: What a plugin registers: the backend class, or a LazyBackend standing for it.
BackendEntry = type[LlmBackend] | LazyBackend


def _class_of(entry: BackendEntry) -> type[LlmBackend]:
    return entry.resolve() if isinstance(entry, LazyBackend) else entry


def why_unavailable(entry: BackendEntry) -> str | None:
    """Why this backend cannot run here: its own reason (a missing library), else its native
    code dying in a child process on this CPU (:mod:`ruvllm.native_probe`), else None."""
    reason = entry.unavailable_reason()
    if reason is not None:
        return reason
    cls = _class_of(entry)
    return crash_reason(cls.name, cls.native_probe())


@attrs.frozen
class AutoChoice:
    """The backend ``auto`` picked and why (tune's figures, or the fixed order and what was skipped)."""

    name: str
    why: str

    def __str__(self) -> str:
        return f"auto -> {self.name}: {self.why}"


@attrs.define
class BackendRegistry:
    """Every backend that plugins registered, plus the plugins that failed.

    ``backends`` maps a name to the class, or to the LazyBackend a plugin registered instead;
    both answer ``name``, ``formats`` and the class methods. :meth:`get` and :meth:`select`
    always return the class itself.
    """

    pm: pluggy.PluginManager
    backends: dict[str, BackendEntry] = attrs.field(factory=dict)
    failures: list[PluginFailure] = attrs.field(factory=list)
    #: Backend name -> distribution that provides it.
    providers: dict[str, str] = attrs.field(factory=dict)

    def register_backend(self, cls: BackendEntry, provider: str = "") -> None:
        if cls.name in self.backends and self.backends[cls.name] is not cls:
            self.failures.append(
                PluginFailure(provider or cls.__module__, f"backend name {cls.name!r} is already taken")
            )
            return
        self.backends[cls.name] = cls
        self.providers[cls.name] = provider

    def get(self, name: str) -> type[LlmBackend]:
        try:
            entry = self.backends[name]
        except KeyError:
            raise UnknownBackend(name, list(self.backends)) from None
        return _class_of(entry)

    def select(self, name: str, model: ModelSource | None = None, *, load: int = 1,
               cache_dir: Path | None = None) -> type[LlmBackend]:
        """The backend class to use: by name, or when ``name == "auto"`` the first that can run
        here in the order ``ruvllm tune`` measured fastest for ``load`` clients on this machine
        (its record under ``cache_dir``), else in the fixed preference order."""
        if name != "auto":
            if name not in self.backends:
                raise UnknownBackend(name, list(self.backends))
            cls = self.backends[name]
            reason = why_unavailable(cls)
            if reason:
                raise BackendUnavailable(name, reason)
            if model is not None and model.format not in cls.formats:
                # Fail here with the reason rather than deep inside the engine's loader.
                raise BackendUnavailable(
                    name, f"it cannot read {model.format} models (it reads: {', '.join(cls.formats)}); "
                    f"pick another backend or a model in one of those formats"
                )
            return _class_of(cls)
        return _class_of(self.backends[self.auto_choice(model, load=load, cache_dir=cache_dir).name])

    def auto_choice(self, model: ModelSource | None = None, *, load: int = 1,
                    cache_dir: Path | None = None) -> AutoChoice:
        """The backend ``auto`` picks for ``load`` clients, and why: the serving engine keeps it,
        so ``ruvllm serve`` prints it at start-up and ``/health`` reports it, and a user sees
        whether a measurement or a fixed order chose it."""
        fixed = AUTO_PREFERENCE[platform_key()]
        preference = None
        if model is not None and cache_dir is not None:
            preference = measured_preference(cache_dir, model, load, fixed)
        if preference is None and model is not None:
            preference = self._claimed(model, fixed)
        if preference is None:
            preference = Preference(fixed, f"preference order for {platform_key()}: {', '.join(fixed)}; "
                                           "not measured on this machine (`ruvllm tune` measures)")
        order = preference.order
        names = list(order) + sorted(set(self.backends) - set(order))
        skipped = []
        for candidate in names:
            cls = self.backends.get(candidate)
            if cls is None:
                skipped.append(f"{candidate}: not installed")
                continue
            reason = why_unavailable(cls)
            if reason:
                skipped.append(f"{candidate}: {reason}")
                continue
            if model is not None and model.format not in cls.formats:
                skipped.append(f"{candidate}: cannot read {model.format} models")
                continue
            skips = "; skipped " + "; ".join(skipped) if skipped else ""
            choice = AutoChoice(candidate, preference.why + skips)
            log.info("backend %s", choice)  # logged where decided, whoever asked
            return choice
        raise BackendUnavailable("auto", "no installed backend can run here: " + "; ".join(skipped))


    def _claimed(self, model: ModelSource, fixed: Sequence[str]) -> Preference | None:
        """The fixed order with the first backend that claims to serve ``model`` fastest here
        (LlmBackend.fastest_here) moved to the front; None when none claims it."""
        for name in fixed:
            entry = self.backends.get(name)
            if entry is None or (reason := entry.fastest_here(model)) is None:
                continue
            order = (name, *(b for b in fixed if b != name))
            return Preference(order, f"{name} claims this machine and model: {reason}; not measured "
                                     "on this machine (`ruvllm tune` measures)")
        return None


def _allowlist() -> set[str] | None:
    raw = os.environ.get(ALLOWLIST_ENV)
    if raw is None or not raw.strip():
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def load_registry() -> BackendRegistry:
    """Discover and register every allowed plugin; never raises for a broken plugin."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    registry = BackendRegistry(pm=pm)
    allowed = _allowlist()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if allowed is not None and ep.name not in allowed:
            continue
        dist = ep.dist.name if ep.dist is not None else ep.name
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:  # a broken plugin is recorded, not fatal
            registry.failures.append(
                PluginFailure(dist, f"{type(exc).__name__}: {exc}", traceback.format_exc())
            )
            continue
        _collect(registry, pm, plugin, dist)
    return registry


def _collect(registry: BackendRegistry, pm: pluggy.PluginManager, plugin: object, dist: str) -> None:
    hook = pm.subset_hook_caller("ruvllm_register_backends", remove_plugins=[
        p for p in pm.get_plugins() if p is not plugin
    ])
    try:
        hook(register=lambda cls: registry.register_backend(cls, dist))
    except Exception as exc:
        registry.failures.append(
            PluginFailure(dist, f"registering backends failed: {exc}", traceback.format_exc())
        )


_registry: BackendRegistry | None = None


def get_registry() -> BackendRegistry:
    """The process-wide registry, discovered on first use."""
    global _registry
    if _registry is None:
        _registry = load_registry()
    return _registry
