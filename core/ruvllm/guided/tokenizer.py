"""The grammar engines' view of a model's vocabulary, built from ruvllm's own tokenizer.

A grammar mask is only right if the engine knows the exact bytes of every token id the engine
samples from, so the table is built from the backend's tokenizer (the same one that encodes the
prompt), not from a separately downloaded ``tokenizer.json``: llama.cpp's vocabulary through its
``decode_bytes``, Hugging Face ``tokenizers`` through ``token_bytes()``. Control tokens must never
be produced by grammar text: llguidance takes them with a ``0xFF`` prefix, xgrammar as empty
tokens (which it treats as special). Building a table costs ~0.5 s at 49k tokens, so each
engine's view is made once per tokenizer object and kept (:func:`cached_view`).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from ruvllm.errors import InvalidRequest
from ruvllm.tokenizer import Tokenizer

T = TypeVar("T")

#: llguidance marks special (control) tokens with this leading byte.
SPECIAL_PREFIX = b"\xff"

_cache: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_by_id: dict[int, dict[str, Any]] = {}
_lock = threading.Lock()


def token_byte_table(tokenizer: Tokenizer, *, special_prefix: bytes | None = SPECIAL_PREFIX) -> list[bytes]:
    """The raw bytes of every token id; special tokens prefixed with ``special_prefix``, or
    given no bytes at all when it is None.

    Raises InvalidRequest (field ``response_format``) when the tokenizer cannot give exact
    bytes per token: a guess built from display text would let the grammar allow tokens whose
    real bytes break it.
    """
    n = tokenizer.vocab_size
    raw: Sequence[bytes]
    token_bytes = getattr(tokenizer, "token_bytes", None)
    decode_bytes = getattr(tokenizer, "decode_bytes", None)
    if callable(token_bytes):
        raw = token_bytes()
    elif callable(decode_bytes):
        raw = [decode_bytes([i], skip_special=False) for i in range(n)]
    else:
        raise InvalidRequest(
            "response_format", f"constrained decoding needs the exact bytes of each token, and this "
            f"backend's tokenizer ({type(tokenizer).__name__}) offers neither token_bytes() nor "
            "decode_bytes(); serve the model with a backend whose tokenizer does (llamacpp)")
    table = []
    for i in range(n):
        piece = bytes(raw[i]) if i < len(raw) else b""
        if tokenizer.is_special(i) and piece:
            piece = b"" if special_prefix is None else special_prefix + piece
        table.append(piece)
    return table


def require_eos(tokenizer: Tokenizer) -> None:
    """A grammar ends the output with an end-of-sequence token, so the model must declare one."""
    if not tokenizer.eos_ids:
        raise InvalidRequest("response_format", "constrained decoding needs an end-of-sequence "
                             "token, and this model's tokenizer declares none")


def cached_view(tokenizer: Tokenizer, engine: str, build: Callable[[Tokenizer], T]) -> T:
    """``build(tokenizer)``, made once per (tokenizer object, engine) and kept while the
    tokenizer lives (for the process's lifetime when it is not weak-referenceable)."""
    with _lock:
        try:
            views = _cache.get(tokenizer)
            if views is None:
                views = _cache[tokenizer] = {}
        except TypeError:  # not weak-referenceable: cache by id for the process's lifetime
            views = _by_id.setdefault(id(tokenizer), {})
        if engine not in views:
            views[engine] = build(tokenizer)
        return views[engine]
