"""The tokenizer contract and the one incremental detokenizer every backend shares."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol, runtime_checkable

from ruvllm.errors import InvalidRequest


def require_encodable(field: str, text: str) -> str:
    """``text`` unchanged, or InvalidRequest naming ``field`` when it cannot be UTF-8 encoded.

    JSON lets a client send a lone UTF-16 surrogate (``"\\ud800"``), and Python keeps it in a
    str; every tokenizer underneath encodes to UTF-8 and would fail with a bare
    UnicodeEncodeError (a 500 from the server). Checked once in core, before any backend sees it.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidRequest(
            field, f"contains a lone UTF-16 surrogate {text[exc.start]!r} at character {exc.start}, "
            "which is not valid Unicode; send well-formed UTF-8 (combine surrogate pairs)", None,
        ) from None
    return text


def require_in_vocabulary(field: str, ids: Iterable[int], vocab_size: int, advice: str = "") -> None:
    """InvalidRequest naming ``field`` at the first id outside ``[0, vocab_size)`` (``advice``
    says how to fix it where the field's origin does): the one wording of the check every path
    makes before token ids reach a model."""
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidRequest(field, f"token id {bad} is outside the vocabulary [0, {vocab_size}){advice}",
                             bad)


def require_prompt_text(text: str) -> str:
    """``text`` unchanged, or InvalidRequest (field ``prompt``) when it is empty or cannot be
    UTF-8 encoded: the one check before any tokenizer sees a prompt."""
    if not text:
        raise InvalidRequest("prompt", "must not be empty")
    return require_encodable("prompt", text)


def common_prefix(a: Sequence[int], b: Sequence[int], limit: int | None = None, start: int = 0) -> int:
    """The first position from ``start`` (at most ``limit``) where the token sequences ``a`` and
    ``b`` differ or end: how much of a cached prompt a new one reuses. Compared 64 tokens at a
    time (one slice comparison in C), since prompts share long runs."""
    end = min(len(a), len(b)) if limit is None else min(len(a), len(b), limit)
    i = start
    while i + 64 <= end and a[i:i + 64] == b[i:i + 64]:
        i += 64
    while i < end and a[i] == b[i]:
        i += 1
    return max(i, start)


@runtime_checkable
class Tokenizer(Protocol):
    """What ruvllm needs from a model's tokenizer.

    ``decode`` must be exact on whole sequences: streaming text is built from it, so a tokenizer
    whose ``decode`` is lossy makes streaming and non-streaming text disagree.
    """

    @property
    def vocab_size(self) -> int: ...

    @property
    def bos_id(self) -> int | None: ...

    @property
    def eos_ids(self) -> tuple[int, ...]: ...

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``; ``add_special`` prepends BOS where the model wants one;
        ``parse_special`` turns special-token text (``<|im_start|>``) into its id, which chat
        prompts need and user text must not get."""
        ...

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        """Text of ``ids``; invalid or incomplete UTF-8 comes back as U+FFFD."""
        ...

    def is_special(self, token_id: int) -> bool: ...

    def token_text(self, token_id: int) -> str:
        """Display form of one token (for logprobs); may contain U+FFFD for partial bytes."""
        ...


REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas.

    Decoding a token on its own is wrong twice over: a multi-byte UTF-8 character can be split
    across tokens, and some tokenizers (SentencePiece) change a token's text depending on what
    precedes it. So, as vLLM and TGI do, we decode a short window ending at the new token and
    compare it with the same window without it; text is released only once it no longer ends in
    an incomplete character. The concatenated deltas equal ``decode(all_ids)``.
    """

    def __init__(self, tokenizer: Tokenizer, *, skip_special: bool = True, context: Sequence[int] = ()):
        self._tok = tokenizer
        self._skip = skip_special
        self._ids: list[int] = list(context[-4:])
        # [prefix, read) is text already emitted that new tokens are decoded after.
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        """Add one token; return the text it made final (possibly empty)."""
        self._ids.append(token_id)
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], skip_special=self._skip)
        full_text = self._tok.decode(self._ids[self._prefix :], skip_special=self._skip)
        if full_text.endswith(REPLACEMENT) or len(full_text) <= len(prefix_text):
            return ""
        delta = full_text[len(prefix_text) :]
        self._prefix = self._read
        self._read = len(self._ids)
        return delta

    def flush(self) -> str:
        """Text still held back at the end of generation (e.g. a dangling partial character)."""
        prefix_text = self._tok.decode(self._ids[self._prefix : self._read], skip_special=self._skip)
        full_text = self._tok.decode(self._ids[self._prefix :], skip_special=self._skip)
        self._prefix = self._read = len(self._ids)
        return full_text[len(prefix_text) :] if len(full_text) > len(prefix_text) else ""


def _raw_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    """A token's bytes where the tokenizer gives them (``decode_bytes``), else its text's."""
    decode_bytes = getattr(tokenizer, "decode_bytes", None)
    if callable(decode_bytes):
        return decode_bytes([token_id], skip_special=False)
    return tokenizer.token_text(token_id).encode("utf-8")


def token_piece(tokenizer: Tokenizer, token_id: int) -> str | list[int]:
    """One token as llama-server's ``/tokenize`` shows it: its text, or its bytes where they are
    not UTF-8 on their own (a piece of a character)."""
    raw = _raw_bytes(tokenizer, token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return list(raw)


def text_bytes(tokenizer: Tokenizer, token_id: int) -> bytes:
    """A token's text as bytes, as llama.cpp's ``token_to_piece`` gives it without special
    tokens: empty for a control token."""
    return b"" if tokenizer.is_special(token_id) else _raw_bytes(tokenizer, token_id)
