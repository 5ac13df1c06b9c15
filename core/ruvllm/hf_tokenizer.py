"""The one :class:`~ruvllm.tokenizer.Tokenizer` built on the Hugging Face ``tokenizers`` library.

Backends that run the model themselves (candle_like, mlx) or whose engine tokenizes but streams
no ids (mistral.rs) all need the model's tokenizer in Python, and it must give exactly the ids
the engine expects. Two sources:

- a GGUF file's ``tokenizer.ggml.*`` metadata (:meth:`HfTokenizer.from_gguf_metadata`), as plain
  Python values so every plugin can feed it from its own GGUF reader. We rebuild llama.cpp's
  tokenizer: byte-level BPE with the exact chain of pre-tokenizer regexes llama.cpp applies for
  the declared ``tokenizer.ggml.pre`` type (each regex splits the pieces the previous one
  produced, unmatched stretches kept), or, for ``tokenizer.ggml.model == "llama"``, a
  SentencePiece-style BPE with byte fallback. The result is an ordinary ``tokenizers.Tokenizer``,
  so ``ruvllm convert`` can save it as ``tokenizer.json``.
- a Hugging Face directory (:meth:`HfTokenizer.from_hf_dir`): ``tokenizer.json`` plus the
  special tokens and chat template from ``tokenizer_config.json``, ``generation_config.json`` and
  ``config.json``.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

import attrs
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as TokenizersImpl

from ruvllm.errors import ModelLoadError
from ruvllm.fim import find_fim_tokens
from ruvllm.types import FimTokens

# llama.cpp token types (llama_token_type in llama.h), as stored in tokenizer.ggml.token_type.
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
           r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
          r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_DEFAULT = (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]")

#: llama.cpp's regex chain per ``tokenizer.ggml.pre`` value (llama-vocab.cpp).
PRE_TOKENIZER_REGEXES: dict[str, tuple[str, ...]] = {
    "default": _DEFAULT,
    "llama3": (_LLAMA3,), "llama-v3": (_LLAMA3,), "llama-bpe": (_LLAMA3,),
    "falcon3": (_LLAMA3,), "dbrx": (_LLAMA3,), "smaug-bpe": (_LLAMA3,),
    "qwen2": (_QWEN2,), "deepseek-r1-qwen": (_QWEN2,), "stablelm2": (_QWEN2,), "megrez": (_QWEN2,),
    "smollm": (r"\p{N}", _GPT2), "starcoder": (r"\p{N}", _GPT2), "refact": (r"\p{N}", _GPT2),
    "command-r": (r"\p{N}", _GPT2), "codeshell": (r"\p{N}", _GPT2), "exaone": (r"\p{N}", _GPT2),
    "gpt-2": (_GPT2,), "gpt2": (_GPT2,), "phi-2": (_GPT2,), "mpt": (_GPT2,), "olmo": (_GPT2,),
    "jina-es": (_GPT2,), "jina-de": (_GPT2,),
}
#: Pre-tokenizer types for which llama.cpp looks a whole pre-token up before merging, and adds
#: BOS when the GGUF does not say.
_LLAMA3_FAMILY = {"llama3", "llama-v3", "llama-bpe", "falcon3"}


class HfTokenizer:
    """ruvllm's Tokenizer protocol over a ``tokenizers.Tokenizer``.

    ``impl`` is the complete tokenizer (its post-processor adds BOS/EOS as the model wants, so
    saving it gives a ``tokenizer.json`` transformers reads correctly). Encoding never runs the
    post-processor: BOS/EOS are added here from ``add_bos``/``add_eos``, so that
    ``add_special=False`` (a chat prompt whose template already starts with BOS) never doubles
    them, whatever the source file's post-processor does.

    Whether special-token text in the input is matched (``parse_special``) is ``impl``'s
    ``encode_special_tokens`` flag, shared state: it is set and used under one lock, so a request
    thread never sees another's setting. (A second copy without the lock cost ~10 MB resident and
    a 25 MB JSON round trip at load on a 49k vocabulary, for encodes of well under a millisecond.)
    """

    def __init__(self, impl: TokenizersImpl, *, bos_id: int | None, eos_ids: Sequence[int],
                 add_bos: bool, add_eos: bool = False, vocab_size: int | None = None,
                 special_ids: Iterable[int] = (), chat_template: str | None = None):
        self.impl = impl
        self._encoding = threading.Lock()
        self._bos = bos_id
        self._eos = tuple(dict.fromkeys(int(e) for e in eos_ids))
        self.add_bos = add_bos and bos_id is not None
        self.add_eos = add_eos and bool(self._eos)
        self._vocab_size = vocab_size or impl.get_vocab_size(with_added_tokens=True)
        added_special = {tid for tid, added in impl.get_added_tokens_decoder().items() if added.special}
        self._special = frozenset(
            added_special | set(special_ids) | {t for t in (bos_id, *self._eos) if t is not None}
        )
        #: The model's chat template from the same files, or None.
        self.chat_template = chat_template

    # -- Tokenizer protocol -------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    @property
    def bos_id(self) -> int | None:
        return self._bos

    @property
    def eos_ids(self) -> tuple[int, ...]:
        return self._eos

    def encode(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        with self._encoding:
            self.impl.encode_special_tokens = not parse_special
            try:
                ids = self.impl.encode(text, add_special_tokens=False).ids
            finally:
                self.impl.encode_special_tokens = False  # impl as built, for whoever reads it
        if add_special and self.add_bos:
            ids.insert(0, self._bos)
        if add_special and self.add_eos:
            ids.append(self._eos[0])
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self.impl.decode(list(ids), skip_special_tokens=skip_special)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_text(self, token_id: int) -> str:
        return self.impl.decode([token_id], skip_special_tokens=False)

    # -- extras for backends ------------------------------------------------------------------
    def fim_tokens(self) -> FimTokens | None:
        """The fill-in-the-middle tokens of a known family in this vocabulary (ruvllm.fim)."""
        return find_fim_tokens(self.impl.token_to_id)

    @property
    def special_ids(self) -> frozenset[int]:
        """Control tokens plus BOS/EOS: what ``decode(skip_special=True)`` hides."""
        return self._special

    @property
    def byte_level(self) -> bool:
        """True when vocabulary pieces are GPT-2 byte-level strings (``Ġthe``)."""
        return _has_byte_level_decoder(json.loads(self.impl.to_str()).get("decoder"))

    def token_bytes(self) -> list[bytes]:
        """Raw bytes of every token id (an engine that streams bytes, not ids, is mapped back
        with this table). Added tokens are their UTF-8 text; SentencePiece ``<0xNN>`` pieces
        their byte; ``▁`` is a space."""
        return [self._bytes_of(i) for i in range(self._vocab_size)]

    def decode_bytes(self, ids: Sequence[int], *, skip_special: bool = True) -> bytes:
        """The exact bytes of ``ids`` (:meth:`token_bytes`'s, one token at a time): a byte
        token that is part of a character stays that byte, where ``decode`` would show U+FFFD."""
        return b"".join(self._bytes_of(i) for i in ids if not (skip_special and i in self._special))

    @functools.cached_property
    def _added_texts(self) -> dict[int, str]:
        return {i: t.content for i, t in self.impl.get_added_tokens_decoder().items()}

    @functools.cached_property
    def _byte_level(self) -> bool:
        return self.byte_level

    def _bytes_of(self, token_id: int) -> bytes:
        added = self._added_texts.get(token_id)
        if added is not None:
            return added.encode()
        piece = self.impl.id_to_token(token_id)
        u2b = _unicode_to_byte()
        if piece is None:
            return b""
        if self._byte_level and all(c in u2b for c in piece):
            return bytes(u2b[c] for c in piece)
        if len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            return bytes([int(piece[3:5], 16)])
        return piece.replace("\u2581", " ").encode()

    # -- constructors -------------------------------------------------------------------------
    @classmethod
    def from_gguf_metadata(cls, metadata: Mapping[str, Any], *, vocab_size: int | None = None,
                           source: str = "tokenizer") -> HfTokenizer:
        """llama.cpp's tokenizer from GGUF metadata given as plain Python values, keyed by the
        GGUF names (``tokenizer.ggml.tokens``, ``.merges``, ``.token_type``, ``.pre``,
        ``.bos_token_id``...). ``vocab_size`` defaults to ``<arch>.vocab_size`` or the token
        count; ``source`` names the model in errors."""
        vocab = GgufVocab.from_metadata(metadata, source)
        if vocab_size is None:
            arch = metadata.get("general.architecture")
            vocab_size = int(metadata.get(f"{arch}.vocab_size") or len(vocab.tokens))
        return cls.from_gguf_vocab(vocab, vocab_size=vocab_size, source=source)

    @classmethod
    def from_gguf_vocab(cls, vocab: GgufVocab, *, vocab_size: int | None = None,
                        source: str = "tokenizer") -> HfTokenizer:
        """llama.cpp's tokenizer for a :class:`GgufVocab` (a GGUF reader's parsed form)."""
        if vocab.model == "gpt2":
            impl = _byte_level_bpe(vocab, source)
        elif vocab.model == "llama":
            impl = _sentencepiece_bpe(vocab, source)
        else:
            raise ModelLoadError(source, f"GGUF tokenizer.ggml.model {vocab.model!r} is not supported "
                                         f"(gpt2 or llama); load the model's Hugging Face directory instead")
        impl.add_tokens(_added_tokens(vocab))
        impl.post_processor = _bos_eos_processor(impl, vocab.bos_id if vocab.add_bos else None,
                                                 vocab.eos_id if vocab.add_eos else None)
        eos = [e for e in (vocab.eos_id, vocab.eot_id) if e is not None]
        return cls(impl, bos_id=vocab.bos_id, eos_ids=eos, add_bos=vocab.add_bos, add_eos=vocab.add_eos,
                   vocab_size=vocab_size or len(vocab.tokens), chat_template=vocab.chat_template)

    @classmethod
    def from_hf_dir(cls, path: str | Path) -> HfTokenizer:
        """The tokenizer, special tokens and chat template of a Hugging Face model directory."""
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise ModelLoadError(str(path), "no tokenizer.json in the directory; ruvllm needs a fast "
                                            "tokenizer (save one with transformers' save_pretrained)")
        try:
            impl = TokenizersImpl.from_file(str(tj))
        except Exception as exc:  # tokenizers raises a bare Exception on malformed files
            raise ModelLoadError(str(tj), f"tokenizer.json cannot be read: {exc}") from exc
        tcfg = _read_json(path / "tokenizer_config.json")
        gen = _read_json(path / "generation_config.json")
        config = _read_json(path / "config.json")

        def named(value: Any) -> int | None:
            if isinstance(value, dict):
                value = value.get("content")
            return impl.token_to_id(value) if isinstance(value, str) else None

        bos = next((b for b in (named(tcfg.get("bos_token")), gen.get("bos_token_id"),
                                config.get("bos_token_id")) if isinstance(b, int)), None)
        eos: list[int] = []
        for source in (named(tcfg.get("eos_token")), gen.get("eos_token_id"), config.get("eos_token_id")):
            eos.extend(source if isinstance(source, list) else [source] if isinstance(source, int) else [])
        # tokenizer_config's add_bos_token/add_eos_token win (transformers' Llama tokenizers
        # rebuild their post-processor from them); otherwise ask the post-processor.
        with_special = impl.encode("a", add_special_tokens=True).ids
        without = impl.encode("a", add_special_tokens=False).ids
        add_bos = tcfg.get("add_bos_token")
        if not isinstance(add_bos, bool):
            add_bos = bos is not None and with_special[:1] == [bos] and without[:1] != [bos]
        add_eos = tcfg.get("add_eos_token")
        if not isinstance(add_eos, bool):
            add_eos = bool(eos) and with_special[-1:] == [eos[0]] and without[-1:] != [eos[0]]
        special = {int(k) for k, v in (tcfg.get("added_tokens_decoder") or {}).items()
                   if isinstance(v, dict) and v.get("special")}
        vocab_size = max(impl.get_vocab_size(with_added_tokens=True), int(config.get("vocab_size") or 0))
        return cls(impl, bos_id=bos, eos_ids=eos, add_bos=add_bos, add_eos=add_eos, vocab_size=vocab_size,
                   special_ids=special, chat_template=_hf_chat_template(path, tcfg))


@attrs.frozen(kw_only=True)
class GgufVocab:
    """A GGUF file's ``tokenizer.ggml.*`` metadata as plain Python values.

    Plugins read GGUF files with different libraries (``gguf.GGUFReader``, ``mx.load``); this is
    the one form they all turn it into, and the one a GGUF writer writes back. Missing keys take
    llama.cpp's defaults (:meth:`from_metadata`).
    """

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece)
    pre: str
    tokens: list[str]
    token_types: list[int]
    merges: list[str] = attrs.field(factory=list)
    scores: list[float] | None = None
    bos_id: int | None = None
    eos_id: int | None = None
    eot_id: int | None = None
    unk_id: int | None = None
    pad_id: int | None = None
    add_bos: bool = False
    add_eos: bool = False
    add_space_prefix: bool = False
    chat_template: str | None = None

    def __attrs_post_init__(self) -> None:
        if not self.tokens or not all(isinstance(t, str) for t in self.tokens):
            raise ModelLoadError("tokenizer", "GGUF tokenizer.ggml.tokens must be a non-empty list of "
                                              "strings; re-convert the model with its tokenizer")
        for key, values in (("token_type", self.token_types), ("scores", self.scores)):
            if values is not None and len(values) != len(self.tokens):
                raise ModelLoadError("tokenizer", f"GGUF tokenizer.ggml.{key} has {len(values)} entries for "
                                                  f"{len(self.tokens)} tokens; the file is inconsistent")

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any], source: str = "tokenizer") -> GgufVocab:
        """From GGUF keys (``tokenizer.ggml.tokens``...) to plain values; ``source`` names the
        model in errors."""
        def get(key: str, default: Any = None) -> Any:
            value = metadata.get(f"tokenizer.ggml.{key}")
            return default if value is None else value

        def token_id(key: str) -> int | None:
            value = get(key)
            return None if value is None else int(value)

        tokens = get("tokens")
        model = get("model", "gpt2")
        pre = get("pre", "default")
        scores = get("scores")
        try:
            return cls(
                model=model, pre=pre, tokens=list(tokens or []),
                token_types=[int(t) for t in get("token_type", [NORMAL] * len(tokens or []))],
                merges=list(get("merges", [])),
                scores=[float(s) for s in scores] if scores is not None else None,
                bos_id=token_id("bos_token_id"), eos_id=token_id("eos_token_id"),
                eot_id=token_id("eot_token_id"), unk_id=token_id("unknown_token_id"),
                pad_id=token_id("padding_token_id"),
                # llama.cpp's defaults: SentencePiece and Llama 3 vocabularies want BOS.
                add_bos=bool(get("add_bos_token", model == "llama" or pre in _LLAMA3_FAMILY)),
                add_eos=bool(get("add_eos_token", False)),
                add_space_prefix=bool(get("add_space_prefix", model == "llama")),
                chat_template=metadata.get("tokenizer.chat_template"),
            )
        except ModelLoadError as exc:
            raise ModelLoadError(source, exc.reason) from None

    def metadata(self) -> dict[str, Any]:
        """The values under their GGUF keys (what :meth:`from_metadata` reads back)."""
        values = {
            "model": self.model, "pre": self.pre, "tokens": self.tokens, "token_type": self.token_types,
            "merges": self.merges, "scores": self.scores, "bos_token_id": self.bos_id,
            "eos_token_id": self.eos_id, "eot_token_id": self.eot_id, "unknown_token_id": self.unk_id,
            "padding_token_id": self.pad_id, "add_bos_token": self.add_bos, "add_eos_token": self.add_eos,
            "add_space_prefix": self.add_space_prefix,
        }
        out: dict[str, Any] = {f"tokenizer.ggml.{k}": v for k, v in values.items() if v is not None}
        if self.chat_template is not None:
            out["tokenizer.chat_template"] = self.chat_template
        return out


def _added_tokens(meta: GgufVocab) -> list[AddedToken]:
    """Control and user-defined tokens are matched whole, as llama.cpp's partitioning does.

    Control tokens (and BOS/EOS/EOT) are ``special``: only parsed when asked for and hidden by
    ``skip_special``; user-defined ones are always matched and always shown."""
    out = []
    for i, (text, kind) in enumerate(zip(meta.tokens, meta.token_types, strict=True)):
        if kind in (CONTROL, USER_DEFINED) or i in (meta.bos_id, meta.eos_id, meta.eot_id):
            out.append(AddedToken(text, special=kind != USER_DEFINED, normalized=False))
    return out


def _byte_level_bpe(meta: GgufVocab, source: str) -> TokenizersImpl:
    regexes = PRE_TOKENIZER_REGEXES.get(meta.pre)
    if regexes is None:
        raise ModelLoadError(source, f"GGUF tokenizer.ggml.pre {meta.pre!r} is not supported; supported: "
                                     f"{', '.join(sorted(PRE_TOKENIZER_REGEXES))}")
    vocab = {t: i for i, t in enumerate(meta.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta.merges]
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=meta.pre in _LLAMA3_FAMILY)
    tok = TokenizersImpl(bpe)
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _spm_merges(vocab: dict[str, int], scores: Sequence[float]) -> list[tuple[str, str]]:
    """Merges implied by a SentencePiece vocabulary: every split of a piece into two pieces,
    ranked by the merged piece's score (what transformers' SentencePiece converter does)."""
    ranked = []
    for piece, idx in vocab.items():
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                ranked.append((-scores[idx], vocab[left], vocab[right], left, right))
    ranked.sort()
    return [(left, right) for *_, left, right in ranked]


def _sentencepiece_bpe(meta: GgufVocab, source: str) -> TokenizersImpl:
    if meta.scores is None:
        raise ModelLoadError(source, "a SentencePiece GGUF tokenizer needs tokenizer.ggml.scores")
    vocab = {t: i for i, t in enumerate(meta.tokens)}
    unk = meta.tokens[meta.unk_id] if meta.unk_id is not None else None
    bpe = models.BPE(vocab=vocab, merges=_spm_merges(vocab, meta.scores), unk_token=unk,
                     fuse_unk=True, byte_fallback=True)
    tok = TokenizersImpl(bpe)
    steps = [normalizers.Replace(" ", "\u2581")]
    if meta.add_space_prefix:
        steps.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    strip = [decoders.Strip(" ", 1, 0)] if meta.add_space_prefix else []
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tok


def _bos_eos_processor(impl: TokenizersImpl, bos: int | None, eos: int | None) -> Any:
    """A post-processor adding BOS/EOS, so a saved ``tokenizer.json`` behaves as the GGUF says."""
    if bos is None and eos is None:
        return None
    head = [impl.id_to_token(bos)] if bos is not None else []
    tail = [impl.id_to_token(eos)] if eos is not None else []
    single = " ".join([*head, "$A", *tail])
    pair = " ".join([*head, "$A", *tail, *head, "$B", *tail])
    specials = [(impl.id_to_token(t), t) for t in dict.fromkeys(x for x in (bos, eos) if x is not None)]
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=specials)


def _has_byte_level_decoder(decoder: Any) -> bool:
    if not isinstance(decoder, dict):
        return False
    if decoder.get("type") == "ByteLevel":
        return True
    return any(_has_byte_level_decoder(d) for d in decoder.get("decoders") or [])


@lru_cache(maxsize=1)
def byte_level_alphabet() -> tuple[str, ...]:
    """GPT-2's bytes_to_unicode: the printable character byte-level BPE writes for each byte
    (index = byte value)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = 256 + extra
            extra += 1
    return tuple(chr(table[b]) for b in range(256))


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in enumerate(byte_level_alphabet())}


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ModelLoadError(str(path), f"{path.name} is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _hf_chat_template(path: Path, tcfg: Mapping[str, Any]) -> str | None:
    """``chat_template.jinja`` (newer transformers), ``chat_template.json``, then
    ``tokenizer_config.json``; of a list of named templates, the ``default`` one."""
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text(encoding="utf-8")
    for cfg in (_read_json(path / "chat_template.json"), tcfg):
        template = cfg.get("chat_template")
        if isinstance(template, list):
            by_name = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = by_name.get("default") or next(iter(by_name.values()), None)
        if isinstance(template, str):
            return template
    return None
