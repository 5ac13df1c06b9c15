"""The tokenizer contract: exact round trips, ids inside the vocabulary, consistent specials.

Streaming text is built by decoding ids, so a lossy ``decode`` makes streamed and non-streamed
text disagree and corrupts stop-string matching; these texts cover the scripts where tokenizer
wrappers usually go wrong (multi-byte UTF-8, byte fallback, leading and repeated whitespace).
"""

from __future__ import annotations

import pytest

from ruvllm.llm import LLM

CORPUS = {
    "ascii": "The quick brown fox jumps over the lazy dog. 0123456789 !?#$%&*()[]{}",
    "accents": "Crème brûlée, naïve café, Ångström, São Paulo, Łódź, Dvořák, façade.",
    "cjk": "東京は日本の首都です。北京是中国的首都。서울은 한국의 수도입니다.",
    "emoji": "Rockets 🚀 and families 👨‍👩‍👧 with flags 🇫🇷 and skin tones 👍🏽.",
    "code": 'def f(x):\n    return {"a": [x, x**2]}  # comment\n\tif x != 0:\n        pass\n',
    "whitespace": "  two leading spaces,\n\nblank lines,   runs of spaces\tand tabs\t.",
}


class TestTokenizer:
    @pytest.mark.parametrize("name", sorted(CORPUS))
    def test_round_trip(self, ruvllm_llm: LLM, name: str) -> None:
        """decode(encode(text)) == text, with and without the BOS token."""
        tok = ruvllm_llm.tokenizer
        text = CORPUS[name]
        plain = tok.encode(text, add_special=False)
        assert plain, "non-empty text encoded to no tokens"
        assert all(0 <= t < tok.vocab_size for t in plain)
        assert tok.decode(plain) == text
        with_bos = tok.encode(text, add_special=True)
        assert tok.decode(with_bos, skip_special=True) == text
        if tok.bos_id is not None and with_bos[0] == tok.bos_id:
            assert with_bos[1:] == plain

    def test_user_text_is_not_parsed_as_special(self, ruvllm_llm: LLM) -> None:
        """The EOS token's text typed by a user encodes to ordinary tokens unless
        ``parse_special`` is set (else user text could end a request or fake a chat turn)."""
        llm = ruvllm_llm
        eos_text = llm.info.special_tokens.eos_text
        if not eos_text:
            pytest.skip(f"{llm.backend_name}'s model info names no EOS text")
        ids = llm.tokenizer.encode(eos_text, add_special=False)
        assert not set(ids) & set(llm.tokenizer.eos_ids), f"{eos_text!r} -> {ids}"
        special = llm.tokenizer.encode(eos_text, add_special=False, parse_special=True)
        assert special and special[0] in llm.tokenizer.eos_ids

    def test_special_tokens_consistent(self, ruvllm_llm: LLM) -> None:
        """Model info and tokenizer agree on vocabulary size and special ids, and those ids
        are inside the vocabulary and marked special."""
        info, tok = ruvllm_llm.info, ruvllm_llm.tokenizer
        assert info.vocab_size == tok.vocab_size
        assert info.context_length > 0
        assert tuple(info.special_tokens.eos_ids) == tuple(tok.eos_ids)
        assert info.special_tokens.bos_id == tok.bos_id
        for t in (*tok.eos_ids, *(() if tok.bos_id is None else (tok.bos_id,))):
            assert 0 <= t < tok.vocab_size
            assert tok.is_special(t)
        assert tok.decode(list(tok.eos_ids), skip_special=True) == ""
