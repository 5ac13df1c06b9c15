"""The grammar-engine contract: one interface behind which llguidance and xgrammar fill the same masks.

Everything above it (the compile cache and its time limit, the logits processor, the per-step
batched masks) is engine-neutral: a :class:`~ruvllm.guided.grammar.GrammarSpec` carries the
request's language (JSON schema, regex, Lark) and source text, and the engine selected by the
``guided_decoding_backend`` engine option (vLLM's name) turns it into matchers. Both engines
write the same bitmask layout (int32 words, bit ``i % 32`` of word ``i // 32`` is token ``i``), so
rows of either engine share one step's bitmask.

Engines are imported lazily by name: xgrammar imports torch and transformers (~5 s, ~250 MB RSS
measured), which a server that never selects it must not pay for.
"""

from __future__ import annotations

import importlib
import importlib.util
import threading
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar, Protocol

import numpy as np

from ruvllm.errors import GrammarEngineNotInstalled, InvalidRequest
from ruvllm.options import Accepts
from ruvllm.tokenizer import Tokenizer

#: The selectable engines, in vLLM's ``guided_decoding_backend`` spelling.
ENGINE_NAMES = ("llguidance", "xgrammar")
DEFAULT_ENGINE = "llguidance"

# name -> (module, class, the distribution that provides it, how to install it)
_ENGINES: dict[str, tuple[str, str, str, str]] = {
    "llguidance": ("ruvllm.guided.llguidance_engine", "LLGuidanceEngine", "llguidance",
                   "pip install llguidance (a core dependency of ruvllm)"),
    "xgrammar": ("ruvllm.guided.xgrammar_engine", "XGrammarEngine", "xgrammar",
                 "pip install 'ruvllm[xgrammar]' (see docs/structured-output.md for a CPU install "
                 "without triton)"),
}


class GuidedMatcher(Protocol):
    """One request's grammar state, advanced token by token."""

    def consume_token(self, token: int) -> bool:
        """Advance by ``token``; False when the grammar does not allow it."""
        ...

    def error(self) -> str:
        """Why the last refused token broke the grammar (for the log)."""
        ...


class GrammarEngine(ABC):
    """A grammar library behind ruvllm's constrained decoding. Implementations are stateless
    apart from caches, so one instance per process serves every model and request."""

    #: The ``guided_decoding_backend`` value that selects this engine.
    name: ClassVar[str]

    def __init__(self) -> None:
        self._batch_worker: Any = None
        self._batch_lock = threading.Lock()

    def batch_worker(self) -> Any:
        """The engine's batched mask filler (:meth:`make_batch_worker`), made on first use."""
        with self._batch_lock:
            if self._batch_worker is None:
                self._batch_worker = self.make_batch_worker()
            return self._batch_worker

    @abstractmethod
    def make_batch_worker(self) -> Any:
        """The library object that fills many matchers' masks in one call. One thread: the
        model's own threads already want every core, and 16 rows fit beside a forward pass."""

    @abstractmethod
    def vocabulary(self, tokenizer: Tokenizer) -> Any:
        """The engine's view of ``tokenizer``'s vocabulary (exact token bytes), built once per
        tokenizer object and kept; the compile cache keys on its identity."""

    @abstractmethod
    def compile(self, spec: Any, vocabulary: Any) -> Any:
        """Compile ``spec`` (a GrammarSpec) against ``vocabulary`` into a reusable template.
        Blocking, called in a child process under the cache's time limit; raises
        :class:`~ruvllm.errors.InvalidRequest` naming ``spec.field`` when it cannot compile."""

    def portable(self, template: Any) -> Any:
        """``template`` in a picklable form that :meth:`from_portable` turns back into it, or None
        when the engine has none. Compiles run in a child process that is killed at the time
        limit (:mod:`ruvllm.guided.compile`); with a portable form the child's result is used,
        without one the parent compiles again once the child has shown that the grammar compiles
        in time."""
        return None

    def from_portable(self, data: Any, vocabulary: Any) -> Any:
        """The template :meth:`portable` made ``data`` from, bound to ``vocabulary``."""
        raise NotImplementedError(f"{self.name} has no portable form of a compiled grammar")

    @abstractmethod
    def new_matcher(self, template: Any) -> GuidedMatcher:
        """A fresh matcher at the start of the grammar (cheap: one per request)."""

    @abstractmethod
    def fill_masks(self, matchers: Sequence[GuidedMatcher], bitmask: np.ndarray,
                   rows: Sequence[int]) -> None:
        """Write the allowed next tokens of ``matchers[i]`` into ``bitmask[rows[i]]`` (int32,
        C-contiguous). Runs on the mask worker beside the forward pass, so it must not hold the
        GIL for long; both engines fill their rows in native code."""


_instances: dict[str, GrammarEngine] = {}
_lock = threading.Lock()


def installed(name: str) -> bool:
    """Whether engine ``name``'s library can be imported (without importing it)."""
    return importlib.util.find_spec(_ENGINES[name][2]) is not None


def get_engine(name: str = DEFAULT_ENGINE) -> GrammarEngine:
    """The process's engine called ``name`` (imported on first use)."""
    if name not in _ENGINES:
        raise InvalidRequest("guided_decoding_backend",
                             f"must be one of {', '.join(ENGINE_NAMES)}; got {name!r}")
    with _lock:
        engine = _instances.get(name)
        if engine is None:
            if not installed(name):
                raise GrammarEngineNotInstalled(name, _ENGINES[name][3])
            module, cls, _, _ = _ENGINES[name]
            engine = _instances[name] = getattr(importlib.import_module(module), cls)()
        return engine


def first_lines(message: str, n: int = 3) -> str:
    """The start of a compiler's message on one line (no grammar dumps in a 400)."""
    return " ".join(line.strip() for line in message.strip().splitlines()[:n])


def engine_option() -> Accepts:
    """The validator of the ``guided_decoding_backend`` engine option: a known engine whose
    library is installed, checked when the options are parsed (before any weights are read)."""
    return Accepts(f"one of {', '.join(ENGINE_NAMES)} whose library is installed (xgrammar: "
                   f"{_ENGINES['xgrammar'][3]})",
                   lambda v: isinstance(v, str) and v in _ENGINES and installed(v))
