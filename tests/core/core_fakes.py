"""Small, exact stand-ins for pure-logic tests of core (no engine involved).

:class:`ByteTokenizer` implements the :class:`ruvllm.tokenizer.Tokenizer` protocol over raw
UTF-8 bytes: every byte is a token, and so is every byte *pair*, so the tests can cut a
multi-byte character (é, 中, 😀) anywhere they like. Its ``decode`` is exact, as the protocol
demands: the bytes of the ids, decoded with U+FFFD for invalid or incomplete sequences.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from typing import Any

import pluggy
from ruvllm import hookspecs
from ruvllm.plugins import BackendRegistry
from ruvllm.types import SampledToken

N_BYTES = 256
PAIR_BASE = N_BYTES
SPECIAL_BASE = PAIR_BASE + N_BYTES * N_BYTES
SPECIALS = ("<s>", "</s>", "<|im_end|>")
BOS, EOS, IM_END = SPECIAL_BASE, SPECIAL_BASE + 1, SPECIAL_BASE + 2


class ByteTokenizer:
    """Byte and byte-pair tokens plus three special tokens (BOS, EOS, ``<|im_end|>``)."""

    @property
    def vocab_size(self) -> int:
        return SPECIAL_BASE + len(SPECIALS)

    @property
    def bos_id(self) -> int | None:
        return BOS

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return (EOS, IM_END)

    # -- encoding ------------------------------------------------------------------------
    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Pairs from the start, a single byte at the end of an odd-length text."""
        return ([BOS] if add_special else []) + self.encode_bytes(text.encode(), cuts="pairs")

    @staticmethod
    def encode_bytes(data: bytes, *, cuts: str | random.Random = "pairs") -> list[int]:
        """Token ids of ``data``: ``"pairs"``, ``"bytes"`` (one token per byte), or a
        ``random.Random`` that mixes singles and pairs so cuts fall at random places."""
        ids: list[int] = []
        i = 0
        while i < len(data):
            pair = i + 1 < len(data) and (
                cuts == "pairs" or (isinstance(cuts, random.Random) and cuts.random() < 0.5)
            )
            if pair:
                ids.append(PAIR_BASE + data[i] * N_BYTES + data[i + 1])
                i += 2
            else:
                ids.append(data[i])
                i += 1
        return ids

    # -- decoding ------------------------------------------------------------------------
    @staticmethod
    def token_bytes(token_id: int) -> bytes:
        if token_id < PAIR_BASE:
            return bytes([token_id])
        if token_id < SPECIAL_BASE:
            a, b = divmod(token_id - PAIR_BASE, N_BYTES)
            return bytes([a, b])
        return SPECIALS[token_id - SPECIAL_BASE].encode()

    def is_special(self, token_id: int) -> bool:
        return token_id >= SPECIAL_BASE

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        data = b"".join(
            self.token_bytes(t) for t in ids if not (skip_special and self.is_special(t))
        )
        return data.decode("utf-8", errors="replace")

    def token_text(self, token_id: int) -> str:
        return self.token_bytes(token_id).decode("utf-8", errors="replace")


class FakeTokenStream:
    """A backend's token iterator (what ``LlmBackend.generate`` returns), scripted.

    Records whether its ``finally`` block ran, the way a real backend frees its request there,
    and how many tokens were pulled from it.
    """

    def __init__(self, token_ids: Sequence[int], *, logprob: float | None = None,
                 fail_after: int | None = None):
        self.token_ids = list(token_ids)
        self.logprob = logprob
        self.fail_after = fail_after
        self.pulled = 0
        self.released = False
        self._it = self._run()

    def _run(self) -> Iterator[SampledToken]:
        try:
            for i, tid in enumerate(self.token_ids):
                if self.fail_after is not None and i == self.fail_after:
                    raise RuntimeError("engine failed mid-request")
                self.pulled += 1
                top = ((tid, self.logprob),) if self.logprob is not None else ()
                yield SampledToken(token_id=tid, logprob=self.logprob, top_logprobs=top)
        finally:
            self.released = True

    def __iter__(self) -> Iterator[SampledToken]:
        return self._it

    def __next__(self) -> SampledToken:
        return next(self._it)

    def close(self) -> None:
        self._it.close()


def text_ids(text: str) -> list[int]:
    """Ids of ``text`` with one token per byte (every character boundary is a token boundary
    for ASCII, and multi-byte characters span several tokens)."""
    return ByteTokenizer.encode_bytes(text.encode(), cuts="bytes")


_STUB_BACKEND = '''
from ruvllm import hookimpl
from ruvllm.backend import LlmBackend
from ruvllm.types import Capabilities


class Backend(LlmBackend):
    name = {name!r}
    formats = {formats!r}

    @classmethod
    def unavailable_reason(cls):
        return {reason!r}

    @classmethod
    def capabilities(cls):
        return Capabilities(device={device!r})

    @classmethod
    def load(cls, model, options):
        raise RuntimeError("not used by these tests")

    tokenizer = info = None

    def generate(self, prompt_ids, params):
        return iter(())
'''

_REGISTER_HOOK = '''

@hookimpl
def ruvllm_register_backends(register):
    register(Backend)
'''


def stub_backend_source(name: str, *, formats: tuple[str, ...] = ("gguf",), reason: str | None = None,
                        device: str = "cpu", register: bool = True) -> str:
    """Source of a module whose ``Backend`` loads nothing, for discovery and registry tests to
    write to disk as pip would install a plugin; ``register`` adds the entry point's hook
    (a module reached by import path, as LazyBackend reaches one, needs none)."""
    source = _STUB_BACKEND.format(name=name, formats=formats, reason=reason, device=device)
    return source + _REGISTER_HOOK if register else source


def registry_of(*backends: Any) -> BackendRegistry:
    """A registry holding exactly ``backends`` (classes or LazyBackends), each as its own
    distribution, with no entry-point discovery: the installed plugins stay out."""
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    reg = BackendRegistry(pm=pm)
    for backend in backends:
        reg.register_backend(backend, f"dist-{backend.name}")
    return reg
