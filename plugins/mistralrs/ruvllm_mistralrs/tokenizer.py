"""The model's tokenizer behind ruvllm's :class:`~ruvllm.tokenizer.Tokenizer` protocol.

mistral.rs tokenizes inside its engine, but ruvllm needs the tokenizer in Python: core encodes
prompts, detokenizes streams and checks stop strings. We build the same tokenizer mistral.rs
uses with the Hugging Face ``tokenizers`` library: ``tokenizer.json`` for a Hugging Face
directory (the file mistral.rs itself reads), or, for a GGUF file, a byte-level BPE rebuilt from
the GGUF metadata (``tokenizer.ggml.model == "gpt2"``, the family of SmolLM2, Llama 3 and
Qwen2). The backend checks on every request that mistral.rs tokenizes the prompt text into
exactly the ids core gave, so a disagreement is an error, never a silent difference.

:class:`TokenBytes` is the other half: mistral.rs streams each sampled token's raw bytes, not
its id, and the table maps those bytes back to the id.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

from ruvllm.errors import ModelLoadError
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HfTokenizer

# GGUF token types (llama.cpp's llama_token_type).
CONTROL, USER_DEFINED = 3, 4

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
           r"\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|"
          r"\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

#: Pre-tokenizer regexes (applied in order) per GGUF ``tokenizer.ggml.pre`` value, as llama.cpp
#: defines them; only the families this plugin has been checked against mistral.rs with.
GGUF_PRE_TOKENIZERS: dict[str, tuple[str, ...]] = {
    "smollm": (r"\p{N}", _GPT2), "starcoder": (r"\p{N}", _GPT2), "refact": (r"\p{N}", _GPT2),
    "gpt-2": (_GPT2,), "gpt2": (_GPT2,),
    "llama-bpe": (_LLAMA3,), "llama3": (_LLAMA3,), "llama-v3": (_LLAMA3,),
    "qwen2": (_QWEN2,),
}


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode: the printable stand-in of every byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    codes = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            codes.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, codes, strict=True)}


class MistralRsTokenizer:
    """A ``tokenizers.Tokenizer`` plus the special-token facts ruvllm needs."""

    def __init__(self, impl: HfTokenizer, *, bos_id: int | None, eos_ids: Sequence[int],
                 add_bos: bool, byte_level: bool, vocab_size: int | None = None):
        self._impl = impl
        # A second instance that treats special-token text in user input as plain text.
        self._plain = HfTokenizer.from_str(impl.to_str())
        self._plain.encode_special_tokens = True
        self._bos = bos_id
        self._eos = tuple(dict.fromkeys(eos_ids))
        self._add_bos = add_bos
        self.byte_level = byte_level
        self._vocab_size = vocab_size or impl.get_vocab_size(with_added_tokens=True)
        self._special = frozenset(
            t_id for t_id, tok in impl.get_added_tokens_decoder().items() if tok.special
        ) | {t for t in (bos_id, *self._eos) if t is not None}

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
        impl = self._impl if parse_special else self._plain
        ids = impl.encode(text, add_special_tokens=False).ids
        if add_special and self._add_bos and self._bos is not None and ids[:1] != [self._bos]:
            ids = [self._bos, *ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self._impl.decode(list(ids), skip_special_tokens=skip_special)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_text(self, token_id: int) -> str:
        return self._impl.decode([token_id], skip_special_tokens=False)

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special

    # -- for the backend ----------------------------------------------------------------------
    def token_bytes(self) -> list[bytes]:
        """Raw bytes of every token id, as mistral.rs reports a sampled token's ``bytes``."""
        added = {i: t.content for i, t in self._impl.get_added_tokens_decoder().items()}
        u2b = _unicode_to_byte()
        out: list[bytes] = []
        for i in range(self._vocab_size):
            if i in added:
                out.append(added[i].encode())
                continue
            piece = self._impl.id_to_token(i)
            if piece is None:
                out.append(b"")
            elif self.byte_level and all(c in u2b for c in piece):
                out.append(bytes(u2b[c] for c in piece))
            elif len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
                out.append(bytes([int(piece[3:5], 16)]))
            else:
                out.append(piece.replace("\u2581", " ").encode())
        return out


def from_gguf_metadata(fields: Mapping[str, Any]) -> MistralRsTokenizer:
    """Byte-level BPE tokenizer from GGUF ``tokenizer.ggml.*`` metadata."""
    model = fields.get("tokenizer.ggml.model")
    if model != "gpt2":
        raise ModelLoadError(
            "tokenizer",
            f"GGUF tokenizer model {model!r} is not supported by ruvllm-mistralrs (only byte-level "
            f"BPE, 'gpt2'); convert the model to a Hugging Face directory (`ruvllm convert`) and "
            f"load that, which uses its tokenizer.json",
        )
    pre = fields.get("tokenizer.ggml.pre", "gpt2")
    regexes = GGUF_PRE_TOKENIZERS.get(pre)
    if regexes is None:
        raise ModelLoadError(
            "tokenizer",
            f"GGUF pre-tokenizer {pre!r} is not supported; supported: "
            f"{', '.join(sorted(GGUF_PRE_TOKENIZERS))}",
        )
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
    impl = HfTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in ("llama-bpe", "llama3")))
    impl.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in regexes]
        + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
    impl.decoder = decoders.ByteLevel()
    bos = fields.get("tokenizer.ggml.bos_token_id")
    eos = [fields[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in fields]
    impl.add_tokens([
        AddedToken(tokens[i], special=kind == CONTROL, normalized=False)
        for i, kind in enumerate(types)
        if kind in (CONTROL, USER_DEFINED) or i in (bos, *eos)
    ])
    return MistralRsTokenizer(impl, bos_id=bos, eos_ids=eos,
                              add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
                              byte_level=True, vocab_size=len(tokens))


def from_hf_dir(path: Path) -> MistralRsTokenizer:
    """The tokenizer of a Hugging Face directory (``tokenizer.json`` + its configs)."""
    tj = path / "tokenizer.json"
    if not tj.is_file():
        raise ModelLoadError(str(path), "no tokenizer.json in the directory; mistral.rs needs one")
    impl = HfTokenizer.from_file(str(tj))
    cfg = _read_json(path / "tokenizer_config.json")
    model_cfg = _read_json(path / "config.json")
    gen_cfg = _read_json(path / "generation_config.json")

    def token_id(value: Any) -> int | None:
        if isinstance(value, dict):
            value = value.get("content")
        return impl.token_to_id(value) if isinstance(value, str) else None

    bos = token_id(cfg.get("bos_token"))
    if bos is None:
        bos = model_cfg.get("bos_token_id")
    eos: list[int] = []
    sources = (gen_cfg.get("eos_token_id"), model_cfg.get("eos_token_id"), token_id(cfg.get("eos_token")))
    for source in sources:
        eos.extend(source if isinstance(source, list) else [source] if isinstance(source, int) else [])
    decoder = json.loads(impl.to_str()).get("decoder") or {}
    byte_level = decoder.get("type") == "ByteLevel" or any(
        d.get("type") == "ByteLevel" for d in decoder.get("decoders", [])
    )
    # BOS insertion is the post-processor's job in tokenizer.json; ruvllm adds it itself so that
    # `add_special=False` (chat prompts whose template already holds BOS) never doubles it.
    probe = impl.encode("a", add_special_tokens=True).ids
    add_bos = bos is not None and probe[:1] == [bos]
    impl.post_processor = None
    vocab = max(impl.get_vocab_size(with_added_tokens=True), int(model_cfg.get("vocab_size") or 0))
    return MistralRsTokenizer(impl, bos_id=bos, eos_ids=eos, add_bos=add_bos,
                              byte_level=byte_level, vocab_size=vocab)


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    with path.open(encoding="utf-8") as fh:
        data = json.load(fh)
    return data if isinstance(data, dict) else {}
