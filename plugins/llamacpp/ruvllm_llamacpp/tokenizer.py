"""The model's own llama.cpp tokenizer behind ruvllm's :class:`ruvllm.tokenizer.Tokenizer`.

Decoding works on bytes: llama.cpp token pieces are raw byte strings, and a multi-byte UTF-8
character (CJK, emoji) is often split across two or three tokens. Concatenating the bytes of
the whole sequence first and decoding once (``errors="replace"``) is exact for whole sequences;
a sequence that ends inside a character ends in U+FFFD, which core's incremental detokenizer
uses as its "wait for more" signal.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from types import ModuleType

from ruvllm.errors import BackendError
from ruvllm.types import FimTokens


class LlamaCppTokenizer:
    """Tokenizer of one loaded llama.cpp model (valid while the model is loaded)."""

    #: :meth:`encode` may run on any thread, beside a forward pass on the model thread: llama.cpp
    #: only reads the vocabulary (llama-server tokenizes on its HTTP threads while it decodes),
    #: and :meth:`close` waits for a running call before the model is freed. The serving engine
    #: then tokenizes a prompt without waiting for its model thread to finish a step.
    thread_safe = True

    def __init__(self, llama_cpp: ModuleType, vocab: int):
        self._lib = llama_cpp
        self._vocab = vocab
        # Held by encode() and close(): the vocabulary is freed with the model.
        self._lock = threading.Lock()
        self._closed = False
        self._token_t = llama_cpp.llama_token
        n = int(llama_cpp.llama_vocab_n_tokens(vocab))
        self._n_vocab = n
        bos = int(llama_cpp.llama_vocab_bos(vocab))
        #: The vocabulary's BOS token, whether or not the model prepends it.
        self.bos_token_id: int | None = bos if bos >= 0 else None
        self._add_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))
        # One pass over the vocabulary at load (~50 ms for 50k tokens) so that is_special and
        # the EOS set are lookups, not C calls, on the per-token path.
        eog: list[int] = []
        special: set[int] = set()
        for token in range(n):
            if llama_cpp.llama_vocab_is_eog(vocab, token):
                eog.append(token)
                special.add(token)
            elif llama_cpp.llama_vocab_is_control(vocab, token):
                special.add(token)
        eos = int(llama_cpp.llama_vocab_eos(vocab))
        # The model's declared EOS first (what templates call eos_token), then every other
        # end-of-generation token (<|im_end|>, <|eot_id|>, <|endoftext|>...).
        self._eos_ids = tuple(sorted(eog, key=lambda t: (t != eos, t)))
        self.eos_token_id: int | None = eos if eos >= 0 else (self._eos_ids[0] if self._eos_ids else None)
        self._special = frozenset(special)
        self._texts: dict[int, str] = {}

    @property
    def vocab_size(self) -> int:
        return self._n_vocab

    @property
    def bos_id(self) -> int | None:
        """BOS id when the model prepends it to prompts, else None."""
        return self.bos_token_id if self._add_bos else None

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos_ids

    def fim_tokens(self) -> FimTokens | None:
        """The fill-in-the-middle tokens llama.cpp found (GGUF metadata, or the token texts it
        knows), with its repository-level pair where it found both; None without all three."""
        ids = [int(f(self._vocab)) for f in (self._lib.llama_vocab_fim_pre, self._lib.llama_vocab_fim_suf,
                                             self._lib.llama_vocab_fim_mid)]
        if min(ids) < 0:
            return None
        repo, file_sep = (int(f(self._vocab)) for f in (self._lib.llama_vocab_fim_rep,
                                                         self._lib.llama_vocab_fim_sep))
        both = repo >= 0 and file_sep >= 0
        return FimTokens(prefix=ids[0], suffix=ids[1], middle=ids[2],
                         repo=repo if both else None, file_sep=file_sep if both else None)

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        data = text.encode("utf-8")
        # A token covers at least one byte; +2 leaves room for BOS/EOS.
        capacity = len(data) + 2
        while True:
            buf = (self._token_t * capacity)()
            with self._lock:
                if self._closed:
                    raise BackendError("the llamacpp model is closed; its tokenizer cannot encode")
                n = self._lib.llama_tokenize(
                    self._vocab, data, len(data), buf, capacity, add_special, parse_special
                )
            if n >= 0:
                return list(buf[:n])
            if -n <= capacity:  # pragma: no cover - llama.cpp reports a size it then rejects
                raise RuntimeError(f"llama_tokenize failed ({n}) on {len(data)} bytes")
            capacity = -n

    def close(self) -> None:
        """The model is about to be freed: wait for a running :meth:`encode`, refuse later ones."""
        with self._lock:
            self._closed = True

    def decode_bytes(self, ids: Sequence[int], *, skip_special: bool = True) -> bytes:
        """The raw bytes of ``ids`` (what :meth:`decode` turns into text)."""
        n_ids = len(ids)
        if n_ids == 0:
            return b""
        tokens = (self._token_t * n_ids)(*ids)
        capacity = 8 * n_ids + 16
        while True:
            buf = ctypes.create_string_buffer(capacity)
            # remove_special=False: BOS/EOS are dropped through skip_special (unparse_special)
            # like every other control token, not by position.
            n = self._lib.llama_detokenize(self._vocab, tokens, n_ids, buf, capacity, False, not skip_special)
            if n >= 0:
                return buf.raw[:n]
            capacity = -n

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self.decode_bytes(ids, skip_special=skip_special).decode("utf-8", errors="replace")

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self._piece(token_id).decode("utf-8", errors="replace")
            self._texts[token_id] = text
        return text

    def _piece(self, token_id: int) -> bytes:
        capacity = 32
        while True:
            buf = ctypes.create_string_buffer(capacity)
            n = self._lib.llama_token_to_piece(self._vocab, token_id, buf, capacity, 0, True)
            if n >= 0:
                return buf.raw[:n]
            capacity = -n
