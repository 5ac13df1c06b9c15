"""Lazy access to llama-cpp-python, and control over llama.cpp's log output.

``llama_cpp`` loads a compiled shared library at import time; a missing wheel, a build for the
wrong CPU or an ABI mismatch must become a *reason* shown by ``ruvllm backends`` rather than a
crash while plugins are discovered, so nothing here imports it at module level.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import logging
import sys
from collections.abc import Iterator
from types import ModuleType

from ruvllm.errors import BackendUnavailable

#: The low-level functions the backend drives llama.cpp with (the ``llama_memory_*`` API
#: replaced ``llama_kv_self_*`` in llama.cpp b5900 / llama-cpp-python 0.3.16).
REQUIRED_SYMBOLS = (
    "llama_backend_init",
    "llama_model_load_from_file",
    "llama_init_from_model",
    "llama_get_memory",
    "llama_memory_clear",
    "llama_memory_seq_rm",
    "llama_memory_seq_pos_max",
    "llama_batch_init",
    "llama_batch_free",
    "llama_decode",
    "llama_get_logits_ith",
    "llama_tokenize",
    "llama_detokenize",
    "llama_token_to_piece",
    "llama_vocab_is_eog",
    "llama_vocab_is_control",
    "llama_supports_gpu_offload",
)

INSTALL_HINT = "pip install 'llama-cpp-python>=0.3.16' (or `pip install -e plugins/llamacpp`)"

_module: ModuleType | None = None
_problem: str | None = None
_backend_initialised = False
_kept_callbacks: list[object] = []


def problem() -> str | None:
    """Why llama-cpp-python cannot be used here, or None when it can."""
    global _module, _problem
    if _module is not None or _problem is not None:
        return _problem
    try:
        import llama_cpp
    except ImportError as exc:
        _problem = f"llama-cpp-python is not importable ({exc}); {INSTALL_HINT}"
        return _problem
    except OSError as exc:  # the shared library failed to load (wrong CPU, missing libgomp...)
        _problem = f"llama-cpp-python's shared library failed to load ({exc}); reinstall it: {INSTALL_HINT}"
        return _problem
    missing = [name for name in REQUIRED_SYMBOLS if not hasattr(llama_cpp, name)]
    if missing:
        version = getattr(llama_cpp, "__version__", "unknown")
        _problem = (
            f"llama-cpp-python {version} lacks {', '.join(missing)}; upgrade: {INSTALL_HINT}"
        )
        return _problem
    _module = llama_cpp
    return None


def lib(backend_name: str = "llamacpp") -> ModuleType:
    """The ``llama_cpp`` module, with llama.cpp's backends initialised once per process."""
    global _backend_initialised
    reason = problem()
    if reason is not None or _module is None:
        raise BackendUnavailable(backend_name, reason or "llama-cpp-python is not importable")
    if not _backend_initialised:
        _module.llama_backend_init()
        _backend_initialised = True
    return _module


def version() -> str | None:
    if problem() is not None or _module is None:
        return None
    return getattr(_module, "__version__", None)


def set_verbose(verbose: bool) -> None:
    """Filter llama.cpp's log through llama-cpp-python's own logger, as ``Llama(verbose=...)``
    does: only errors unless verbose. Process-wide, like llama.cpp's log callback itself."""
    logging.getLogger("llama-cpp-python").setLevel(logging.DEBUG if verbose else logging.ERROR)


#: ggml log levels (ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 = continuation of
#: the previous message).
_WARN, _ERROR, _CONT = 3, 4, 5


class LogCapture:
    """Collects llama.cpp's warnings and errors while it is installed, so that a model that
    fails to load is reported with llama.cpp's own reason ("invalid magic characters", "wrong
    number of tensors") instead of a bare "failed to load"."""

    def __init__(self, verbose: bool):
        self.verbose = verbose
        self.messages: collections.deque[str] = collections.deque(maxlen=20)
        self._last_level = 0

    def __call__(self, level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
        message = text.decode("utf-8", errors="replace")
        if level == _CONT:
            level = self._last_level
        self._last_level = level
        if self.verbose:
            print(message, end="", file=sys.stderr, flush=True)
        if level in (_WARN, _ERROR) and message.strip():
            self.messages.append(message.strip())

    def reason(self) -> str:
        return "; ".join(self.messages)


@contextlib.contextmanager
def capture_log(llama_cpp: ModuleType, verbose: bool) -> Iterator[LogCapture]:
    """Route llama.cpp's log to a :class:`LogCapture` for the duration, then hand it back to
    llama-cpp-python's default callback."""
    capture = LogCapture(verbose)
    callback = llama_cpp.llama_log_callback(capture)  # kept alive until restored below
    llama_cpp.llama_log_set(callback, ctypes.c_void_p(0))
    try:
        yield capture
    finally:
        restore = getattr(sys.modules.get("llama_cpp._logger"), "llama_log_callback", None)
        if restore is not None:
            llama_cpp.llama_log_set(restore, ctypes.c_void_p(0))
        else:
            # Nothing to hand back to: llama.cpp keeps calling ours, so it must stay alive.
            _kept_callbacks.append(callback)
