"""Tokenizers built with the Hugging Face ``tokenizers`` library, from GGUF metadata or
``tokenizer.json``, behind ruvllm's :class:`~ruvllm.tokenizer.Tokenizer` protocol.

For GGUF models we reproduce llama.cpp's tokenizer: byte-level BPE with the exact chain of
pre-tokenizer regexes llama.cpp applies for the model's declared ``tokenizer.ggml.pre`` type
(each regex splits the pieces the previous one produced, unmatched stretches kept), or a
SentencePiece-style BPE with byte fallback for ``tokenizer.ggml.model == "llama"``. The result is
an ordinary ``tokenizers.Tokenizer``, so ``ruvllm convert`` can save it as ``tokenizer.json``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from ruvllm.errors import ModelLoadError
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors
from tokenizers import Tokenizer as HfTokenizerImpl

from ruvllm_candle_like.gguf_loader import GgufTokenizerData

# llama.cpp token types (llama_token_type in llama.h).
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
#: Pre-tokenizer types for which llama.cpp looks a whole pre-token up before merging.
IGNORE_MERGES = {"llama3", "llama-v3", "llama-bpe", "falcon3"}


def _added_tokens(data: GgufTokenizerData) -> list[AddedToken]:
    """Control and user-defined tokens are matched whole, as llama.cpp's partitioning does.

    Control tokens are ``special`` (only parsed when asked for); user-defined ones always."""
    out = []
    for i, (text, kind) in enumerate(zip(data.tokens, data.token_types, strict=True)):
        if kind in (CONTROL, USER_DEFINED) or i in (data.bos_id, data.eos_id, data.eot_id):
            out.append(AddedToken(text, special=kind != USER_DEFINED, normalized=False))
    return out


def _byte_level_bpe(data: GgufTokenizerData) -> HfTokenizerImpl:
    regexes = PRE_TOKENIZER_REGEXES.get(data.pre)
    if regexes is None:
        raise ModelLoadError(
            "tokenizer",
            f"GGUF pre-tokenizer type {data.pre!r} is not supported; supported: "
            f"{', '.join(sorted(PRE_TOKENIZER_REGEXES))}",
        )
    vocab = {t: i for i, t in enumerate(data.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in data.merges]
    bpe = models.BPE(vocab=vocab, merges=merges, ignore_merges=data.pre in IGNORE_MERGES)
    tok = HfTokenizerImpl(bpe)
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


def _sentencepiece_bpe(data: GgufTokenizerData) -> HfTokenizerImpl:
    if data.scores is None:
        raise ModelLoadError("tokenizer", "a SentencePiece GGUF tokenizer needs tokenizer.ggml.scores")
    vocab = {t: i for i, t in enumerate(data.tokens)}
    unk = data.tokens[data.unk_id] if data.unk_id is not None else None
    bpe = models.BPE(vocab=vocab, merges=_spm_merges(vocab, data.scores), unk_token=unk,
                     fuse_unk=True, byte_fallback=True)
    tok = HfTokenizerImpl(bpe)
    steps = [normalizers.Replace(" ", "\u2581")]
    if data.add_space_prefix:
        steps.insert(0, normalizers.Prepend("\u2581"))
    tok.normalizer = normalizers.Sequence(steps)
    strip = [decoders.Strip(" ", 1, 0)] if data.add_space_prefix else []
    tok.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), *strip]
    )
    return tok


def build_from_gguf(data: GgufTokenizerData) -> HfTokenizerImpl:
    """A ``tokenizers.Tokenizer`` equivalent to llama.cpp's for this GGUF vocabulary."""
    if data.model == "gpt2":
        tok = _byte_level_bpe(data)
    elif data.model == "llama":
        tok = _sentencepiece_bpe(data)
    else:
        raise ModelLoadError(
            "tokenizer", f"GGUF tokenizer model {data.model!r} is not supported (gpt2 or llama)"
        )
    tok.add_tokens(_added_tokens(data))
    if data.add_bos and data.bos_id is not None:
        bos = data.tokens[data.bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, data.bos_id)]
        )
    return tok


class CandleTokenizer:
    """ruvllm's Tokenizer protocol over a ``tokenizers.Tokenizer``.

    Two copies of the tokenizer are kept, one that matches special-token text and one that
    does not, instead of toggling ``encode_special_tokens`` per call: the flag is shared state
    and a request thread could see another thread's setting.
    """

    def __init__(self, tok: HfTokenizerImpl, *, vocab_size: int, bos_id: int | None,
                 eos_ids: Sequence[int], add_bos: bool):
        self.impl = tok
        self._plain = HfTokenizerImpl.from_str(tok.to_str())
        self._plain.encode_special_tokens = True
        self._vocab_size = vocab_size
        self._bos = bos_id
        self._eos = tuple(dict.fromkeys(eos_ids))
        self.add_bos = add_bos
        self._special = {
            tid for tid, added in tok.get_added_tokens_decoder().items() if added.special
        }

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
        tok = self.impl if parse_special else self._plain
        return tok.encode(text, add_special_tokens=add_special).ids

    def decode(self, ids: Sequence[int], *, skip_special: bool = True) -> str:
        return self.impl.decode(list(ids), skip_special_tokens=skip_special)

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special

    def token_text(self, token_id: int) -> str:
        return self.impl.decode([token_id], skip_special_tokens=False)

    def text_of(self, token_id: int) -> str:
        """The vocabulary string of a token (for BOS/EOS text in chat templates)."""
        return self.impl.id_to_token(token_id) or ""


def from_gguf(data: GgufTokenizerData, vocab_size: int, eos_ids: Sequence[int]) -> CandleTokenizer:
    return CandleTokenizer(build_from_gguf(data), vocab_size=vocab_size, bos_id=data.bos_id,
                           eos_ids=eos_ids, add_bos=data.add_bos)


def _token_id(tok: HfTokenizerImpl, value: object) -> int | None:
    if isinstance(value, dict):
        value = value.get("content")
    if isinstance(value, str):
        return tok.token_to_id(value)
    return None


def from_hf_dir(path: Path, vocab_size: int, config_eos: int | list[int] | None,
                config_bos: int | None) -> tuple[CandleTokenizer, str | None]:
    """Tokenizer and chat template of a Hugging Face directory."""
    tj = path / "tokenizer.json"
    if not tj.is_file():
        raise ModelLoadError(str(path), "no tokenizer.json in the directory (a fast tokenizer is needed)")
    tok = HfTokenizerImpl.from_file(str(tj))
    tcfg: dict = {}
    if (path / "tokenizer_config.json").is_file():
        tcfg = json.loads((path / "tokenizer_config.json").read_text())
    gen: dict = {}
    if (path / "generation_config.json").is_file():
        gen = json.loads((path / "generation_config.json").read_text())
    bos = _token_id(tok, tcfg.get("bos_token"))
    if bos is None:
        bos = gen.get("bos_token_id", config_bos)
    eos: list[int] = []
    for source in (gen.get("eos_token_id"), config_eos):
        if isinstance(source, int):
            eos.append(source)
        elif isinstance(source, list):
            eos.extend(int(x) for x in source)
    named = _token_id(tok, tcfg.get("eos_token"))
    if named is not None:
        eos.insert(0, named)
    template = tcfg.get("chat_template")
    if isinstance(template, list):  # named templates: use the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    if template is None and (path / "chat_template.jinja").is_file():
        template = (path / "chat_template.jinja").read_text()
    add_bos = bool(tcfg.get("add_bos_token", False))
    return CandleTokenizer(tok, vocab_size=vocab_size, bos_id=bos, eos_ids=eos, add_bos=add_bos), template
