"""The tokenizer built from GGUF metadata gives llama.cpp's ids on a varied corpus."""

from __future__ import annotations

import pytest
from ruvllm.tokenizer import Tokenizer

from .conftest import llama_cpp_or_skip

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog.",
    "def f(x):\n    return x**2  # square\n\n\tindented()",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "Café naïve résumé Ünïcödé façade",
    "日本語のテキスト、中文字符\uff0c한국어",
    "emoji 🙂👍🏽 🚀🔥 👨‍👩‍👧",
    "  leading  spaces   and 12345 67 numbers 3.14159",
    "it's don't we'll I'M they've",
    "\n\n\n  \t\t",
    "Здравствуй, мир! \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "x = [1,2,3]; y = {'a': 1}",
]


@pytest.fixture(scope="module")
def vocab_only(embedded_source):
    llama_cpp = llama_cpp_or_skip()
    ll = llama_cpp.Llama(str(embedded_source.path), vocab_only=True, verbose=False)
    yield ll
    ll.close()


def test_implements_the_protocol(backend_fp32):
    assert isinstance(backend_fp32.tokenizer, Tokenizer)
    assert backend_fp32.tokenizer.eos_ids == (2,)


@pytest.mark.parametrize("text", CORPUS)
def test_ids_match_llama_cpp(backend_fp32, vocab_only, text):
    tok = backend_fp32.tokenizer
    assert tok.encode(text) == vocab_only.tokenize(text.encode(), add_bos=True, special=False)
    assert tok.decode(tok.encode(text)) == text


def test_special_tokens_parsed_only_when_asked(backend_fp32, vocab_only):
    tok = backend_fp32.tokenizer
    text = "<|im_start|>user\nhi<|im_end|>"
    parsed = tok.encode(text, add_special=False, parse_special=True)
    assert parsed == vocab_only.tokenize(text.encode(), add_bos=False, special=True)
    assert parsed[0] == 1 and tok.is_special(1)
    plain = tok.encode(text, add_special=False)
    assert plain == vocab_only.tokenize(text.encode(), add_bos=False, special=False)
    assert 1 not in plain
    assert tok.decode(parsed, skip_special=True) == "user\nhi"
