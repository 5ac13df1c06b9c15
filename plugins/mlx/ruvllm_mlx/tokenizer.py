"""A :class:`ruvllm.tokenizer.Tokenizer` over the ``tokenizers`` library.

Built either from a Hugging Face ``tokenizer.json`` or from the vocabulary, merges and
pre-tokenizer name stored in a GGUF file (byte-level BPE, as llama.cpp's ``gpt2`` tokenizer
model). The GGUF route mirrors llama.cpp's pre-tokenizer regexes so that ids equal llama.cpp's;
the tests check that on the embedded model.

The candle_like plugin builds the same kind of tokenizer; the two are kept separate on purpose
so neither plugin depends on the other's package.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ruvllm.errors import ModelLoadError
from tokenizers import AddedToken, Regex, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HfTokenizer

# llama.cpp's pre-tokenizer regexes (src/llama-vocab.cpp), by GGUF ``tokenizer.ggml.pre``.
_LLAMA3_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_RE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PRE_TOKENIZERS = {
    "gpt2": lambda: pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    "smollm": lambda: pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ]),
    "llama-bpe": lambda: _split_then_bytes(_LLAMA3_RE),
    "llama3": lambda: _split_then_bytes(_LLAMA3_RE),
    "qwen2": lambda: _split_then_bytes(_QWEN2_RE),
}
#: Pre-tokenizers under which llama.cpp looks a whole word up in the vocabulary before merging.
_IGNORE_MERGES = {"llama-bpe", "llama3"}

_CONTROL, _USER_DEFINED = 3, 4


def _split_then_bytes(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])


class MlxTokenizer:
    """ruvllm's tokenizer contract on top of a ``tokenizers.Tokenizer``.

    Two copies of the tokenizer are held: one that turns special-token text into ids (chat
    prompts) and one that treats it as plain text (user input must not inject control tokens).
    """

    def __init__(self, tok: HfTokenizer, *, bos_id: int | None, eos_ids: Sequence[int],
                 add_bos: bool, special_ids: set[int], post_processor_adds_bos: bool = False):
        self._special = tok
        self._plain = HfTokenizer.from_str(tok.to_str())
        self._plain.encode_special_tokens = True
        self._bos = bos_id
        self._eos = tuple(dict.fromkeys(eos_ids))
        self._add_bos = add_bos
        self._post_bos = post_processor_adds_bos
        self._special_ids = frozenset(special_ids)
        self._vocab_size = tok.get_vocab_size(with_added_tokens=True)

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
        tok = self._special if parse_special else self._plain
        ids = tok.encode(text, add_special_tokens=add_special and self._post_bos).ids
        if add_special and self._add_bos and not self._post_bos and self._bos is not None:
            ids = [self._bos, *ids]
        return ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self._special.decode(list(ids), skip_special_tokens=skip_special)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def token_text(self, token_id: int) -> str:
        return self._special.decode([token_id], skip_special_tokens=False)


def from_gguf_metadata(meta: dict[str, Any], source: str) -> MlxTokenizer:
    """The tokenizer described by a GGUF file's ``tokenizer.ggml.*`` metadata."""
    from ruvllm_mlx.gguf_loader import meta_value

    kind = meta_value(meta, "tokenizer.ggml.model")
    if kind != "gpt2":
        raise ModelLoadError(
            source, f"GGUF tokenizer model {kind!r} is not supported by the mlx backend (it reads "
            f"byte-level BPE, 'gpt2'); use the model's Hugging Face directory instead"
        )
    pre = meta_value(meta, "tokenizer.ggml.pre", "gpt2")
    if pre not in _PRE_TOKENIZERS:
        raise ModelLoadError(
            source, f"GGUF pre-tokenizer {pre!r} is not supported by the mlx backend "
            f"(supported: {', '.join(sorted(_PRE_TOKENIZERS))})"
        )
    tokens: list[str] = meta_value(meta, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in meta_value(meta, "tokenizer.ggml.merges", [])]
    types = meta_value(meta, "tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab: dict[str, int] = {}
    for i, t in enumerate(tokens):
        vocab.setdefault(t, i)
    tok = HfTokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=pre in _IGNORE_MERGES))
    tok.pre_tokenizer = _PRE_TOKENIZERS[pre]()
    tok.decoder = decoders.ByteLevel()
    control = [i for i, t in enumerate(types) if t == _CONTROL]
    user = [i for i, t in enumerate(types) if t == _USER_DEFINED]
    tok.add_special_tokens([AddedToken(tokens[i], special=True, normalized=False) for i in control])
    tok.add_tokens([AddedToken(tokens[i], special=False, normalized=False) for i in user])
    bos = meta_value(meta, "tokenizer.ggml.bos_token_id")
    eos = [meta_value(meta, k) for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id")]
    return MlxTokenizer(
        tok, bos_id=bos, eos_ids=[e for e in eos if e is not None],
        add_bos=bool(meta_value(meta, "tokenizer.ggml.add_bos_token", False)),
        special_ids=set(control),
    )


def _token_content(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value


def from_hf_dir(path: Path) -> tuple[MlxTokenizer, str | None]:
    """The tokenizer of a Hugging Face directory and its chat template (or None)."""
    file = path / "tokenizer.json"
    if not file.is_file():
        raise ModelLoadError(str(path), "the directory has no tokenizer.json")
    tok = HfTokenizer.from_file(str(file))
    cfg_file = path / "tokenizer_config.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.is_file() else {}
    gen_file = path / "generation_config.json"
    gen = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    bos_text, eos_text = _token_content(cfg.get("bos_token")), _token_content(cfg.get("eos_token"))
    bos = tok.token_to_id(bos_text) if bos_text else gen.get("bos_token_id")
    eos: list[int] = []
    if eos_text and tok.token_to_id(eos_text) is not None:
        eos.append(tok.token_to_id(eos_text))
    gen_eos = gen.get("eos_token_id")
    eos += gen_eos if isinstance(gen_eos, list) else [gen_eos] if gen_eos is not None else []
    special = {int(k) for k, v in cfg.get("added_tokens_decoder", {}).items() if v.get("special")}
    special |= {i for i, t in tok.get_added_tokens_decoder().items() if t.special}
    # The post-processor (e.g. Llama 3's TemplateProcessing) adds BOS itself when it has one.
    probe = tok.encode("a", add_special_tokens=True).ids
    post_bos = bos is not None and bool(probe) and probe[0] == bos
    template = cfg.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template}
        template = named.get("default") or next(iter(named.values()), None)
    return MlxTokenizer(tok, bos_id=bos, eos_ids=eos, add_bos=bool(cfg.get("add_bos_token", post_bos)),
                        special_ids=special, post_processor_adds_bos=post_bos), template

