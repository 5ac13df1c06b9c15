"""llguidance's view of a model's vocabulary, built from ruvllm's own tokenizer.

A grammar mask is only right if llguidance knows the exact bytes of every token id the engine
samples from, so the table is built from the backend's tokenizer (the same one that encodes the
prompt), not from a separately downloaded ``tokenizer.json``: llama.cpp's vocabulary through its
``decode_bytes``, Hugging Face ``tokenizers`` through ``token_bytes()``. Control tokens get
llguidance's ``0xFF`` prefix so that no grammar text can ever produce them. Building the table
costs ~0.5 s at 49k tokens, so it is made once per tokenizer object and kept.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import Any

from ruvllm.errors import InvalidRequest
from ruvllm.tokenizer import Tokenizer

#: llguidance marks special (control) tokens with this leading byte.
SPECIAL_PREFIX = b"\xff"

_cache: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_by_id: dict[int, Any] = {}
_lock = threading.Lock()


def token_byte_table(tokenizer: Tokenizer) -> list[bytes]:
    """The raw bytes of every token id, special tokens prefixed with ``0xFF``.

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
        table.append(SPECIAL_PREFIX + piece if tokenizer.is_special(i) and piece else piece)
    return table


class _VocabSource:
    """The object ``llguidance.TokenizerWrapper`` reads: token bytes, EOS/BOS and an encoder."""

    def __init__(self, tokenizer: Tokenizer):
        self._tok = tokenizer
        self.tokens = token_byte_table(tokenizer)
        self.eos_token_id = tokenizer.eos_ids[0] if tokenizer.eos_ids else None
        self.bos_token_id = getattr(tokenizer, "bos_token_id", None) or tokenizer.bos_id
        self.special_token_ids = [i for i in range(len(self.tokens)) if tokenizer.is_special(i)]

    def __call__(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special=False, parse_special=False)


def ll_tokenizer(tokenizer: Tokenizer) -> Any:
    """The ``llguidance.LLTokenizer`` for ``tokenizer``, built once and cached per object."""
    import llguidance

    with _lock:
        try:
            hit = _cache.get(tokenizer)
        except TypeError:  # not weak-referenceable: cache by id for the process's lifetime
            hit = _by_id.get(id(tokenizer))
        if hit is not None:
            return hit
        source = _VocabSource(tokenizer)
        if source.eos_token_id is None:
            raise InvalidRequest("response_format", "constrained decoding needs an end-of-sequence "
                                 "token, and this model's tokenizer declares none")
        built = llguidance.LLTokenizer(llguidance.TokenizerWrapper(source), n_vocab=len(source.tokens),
                                       eos_token=list(tokenizer.eos_ids))
        try:
            _cache[tokenizer] = built
        except TypeError:
            _by_id[id(tokenizer)] = built
        return built
