"""A backend registered by import path, so that plugin discovery does not import its engine.

Discovery loads every installed plugin in every ruvllm process. A plugin that registers its
backend *class* imports the module defining it, and a backend module that imports its engine at
the top brings that engine into processes that never use it: ``ruvllm serve --backend
llamacpp`` held ~210 MB of torch because the candle_like plugin registered its class. A plugin
registers a :class:`LazyBackend` instead; it answers ``name``, ``formats`` and a missing
package itself (``importlib.util.find_spec`` finds a package without importing it) and imports
the class on anything else.
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import attrs


@attrs.define
class LazyBackend:
    """Stands for the backend class at ``target`` ("package.module:Class") until it is used.

    ``requires`` are the top-level packages the backend cannot run without; a missing one is
    its ``unavailable_reason`` without importing anything. ``fastest``: where its
    ``fastest_here`` claim lives ("package.module:function", a module that does not import the
    engine), None for no claim. The registry hands out the real class (``BackendRegistry.get`` /
    ``select``); other attributes are forwarded to it.
    """

    name: str
    target: str
    formats: tuple[str, ...] = attrs.field(default=("gguf",), converter=tuple)
    requires: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    install_hint: str = ""
    fastest: str | None = None
    _cls: Any = attrs.field(default=None, init=False, repr=False, eq=False)

    def resolve(self) -> Any:
        """Import and return the backend class (once); it must declare the same name and formats."""
        if self._cls is None:
            module, _, attr = self.target.partition(":")
            cls = getattr(importlib.import_module(module), attr)
            if cls.name != self.name or tuple(cls.formats) != self.formats:
                raise TypeError(f"{self.target} declares name {cls.name!r} and formats {cls.formats!r}, "
                                f"but was registered as {self.name!r} reading {self.formats!r}")
            self._cls = cls
        return self._cls

    def unavailable_reason(self) -> str | None:
        if (missing := self._missing_requirement()) is not None:
            return missing
        try:
            cls = self.resolve()
        except Exception as exc:  # a broken install is a reason, as for a plugin that fails to import
            return f"importing {self.target} failed: {type(exc).__name__}: {exc}"
        return cls.unavailable_reason()

    def fastest_here(self, model: Any) -> str | None:
        """The backend's claim on ``model`` (a ``ruvllm.models.ModelSource``, a sibling layer this
        module does not import; ruvllm.backend.LlmBackend.fastest_here), without its engine."""
        if self.fastest is None or self._missing_requirement() is not None:
            return None
        module, _, attr = self.fastest.partition(":")
        return getattr(importlib.import_module(module), attr)(model)

    def _missing_requirement(self) -> str | None:
        """A missing required package, found without importing anything."""
        missing = [m for m in self.requires if importlib.util.find_spec(m) is None]
        if not missing:
            return None
        hint = f"; {self.install_hint}" if self.install_hint else ""
        return f"{', '.join(repr(m) for m in missing)} not installed{hint}"

    def __getattr__(self, attr: str) -> Any:
        # Private and dunder lookups (attrs internals, copy, pickle) must not import the engine.
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self.resolve(), attr)
