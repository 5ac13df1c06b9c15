"""The GGUF-built tokenizer gives llama.cpp's ids and decodes exactly."""

from __future__ import annotations

import pytest

TEXTS = [
    "Hello world!",
    "The year 2024 had 366 days.",
    "  leading spaces\n\nand\ttabs  ",
    "émigré café naïve 日本語 🙂",
    "<|im_start|>user\nHi<|im_end|>\n",
    "don't won't I'll we've THEY'RE",
    "x = f(a, b) + 12345 * 3.14;",
    "URL: https://example.com/a?b=c#frag",
]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(backend, text):
    tok = backend.tokenizer
    assert tok.decode(tok.encode(text)) == text


def test_special_text_is_parsed_only_when_asked(backend):
    tok = backend.tokenizer
    assert tok.encode("<|im_start|>", parse_special=True) == [1]
    plain = tok.encode("<|im_start|>")
    assert 1 not in plain and tok.decode(plain) == "<|im_start|>"
    assert tok.is_special(2) and not tok.is_special(504)
    assert tok.decode([2, 504]) == "The"
    assert tok.decode([2, 504], skip_special=False) == "<|im_end|>The"
    assert tok.token_text(2) == "<|im_end|>"


def test_ids_equal_llama_cpp(backend, model_path):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    vocab = llama_cpp.Llama(str(model_path), vocab_only=True, verbose=False)
    tok = backend.tokenizer
    for text in TEXTS:
        for special in (False, True):
            expected = vocab.tokenize(text.encode(), add_bos=True, special=special)
            assert tok.encode(text, parse_special=special) == expected, (text, special)
