"""IncrementalDetokenizer: streamed deltas add up to decode(all ids), never show a half character.

The byte-level test tokenizer cuts é (2 bytes), 中 (3 bytes) and 😀 (4 bytes) at every possible
place; the real SmolLM2 tokenizer (through the llama.cpp plugin, when installed) does the same
with its own byte-fallback and merged tokens.
"""

from __future__ import annotations

import random
import zlib

import pytest
from core_fakes import BOS, EOS, ByteTokenizer, text_ids
from ruvllm.tokenizer import REPLACEMENT, IncrementalDetokenizer

CORPUS = [
    "plain ascii text",
    "café crème brûlée",
    "中文测试，你好世界。",  # noqa: RUF001 (full-width punctuation on purpose)
    "emoji 😀🎉👍🏽 and flags 🇫🇷",
    "mixed: é中😀 ß ñ — “quotes” … ∑∫√",
    "😀😀😀",
    "é",
    "\n\t  spaces\n",
]


def stream(tok, ids, context=()):
    detok = IncrementalDetokenizer(tok, context=context)
    deltas = [detok.push(t) for t in ids]
    return deltas, detok.flush()


@pytest.mark.parametrize("text", CORPUS)
@pytest.mark.parametrize("cuts", ["bytes", "pairs", "random"])
def test_deltas_concatenate_to_the_full_decode(text, cuts):
    tok = ByteTokenizer()
    how = random.Random(zlib.crc32(text.encode())) if cuts == "random" else cuts
    ids = tok.encode_bytes(text.encode(), cuts=how)
    deltas, tail = stream(tok, ids)
    assert "".join(deltas) + tail == tok.decode(ids) == text
    assert tail == ""
    assert not any(REPLACEMENT in d for d in deltas), deltas


@pytest.mark.parametrize("seed", range(30))
def test_random_texts_and_cuts_never_emit_a_replacement_char(seed):
    rng = random.Random(seed)
    text = "".join(rng.choice("aé中😀 \nß") for _ in range(rng.randint(1, 30)))
    tok = ByteTokenizer()
    ids = tok.encode_bytes(text.encode(), cuts=rng)
    deltas, tail = stream(tok, ids)
    assert "".join(deltas) + tail == text
    assert not any(REPLACEMENT in d for d in deltas)


def test_text_is_released_as_soon_as_a_character_completes():
    tok = ByteTokenizer()
    ids = text_ids("a😀b")  # 1 + 4 + 1 byte tokens
    deltas, _ = stream(tok, ids)
    assert deltas == ["a", "", "", "", "😀", "b"]


def test_flush_releases_a_dangling_partial_character_as_replacement():
    tok = ByteTokenizer()
    ids = text_ids("ok ") + list("😀".encode()[:2])
    deltas, tail = stream(tok, ids)
    assert "".join(deltas) == "ok "
    assert tail == REPLACEMENT
    assert "".join(deltas) + tail == tok.decode(ids)


def test_flush_twice_returns_nothing_new():
    tok = ByteTokenizer()
    detok = IncrementalDetokenizer(tok)
    detok.push("é".encode()[0])
    assert detok.flush() == REPLACEMENT
    assert detok.flush() == ""


def test_prompt_context_is_not_repeated():
    tok = ByteTokenizer()
    prompt = [BOS, *tok.encode_bytes("Say 中文:".encode())]
    out = tok.encode_bytes(" 好的😀".encode(), cuts=random.Random(3))
    deltas, tail = stream(tok, out, context=prompt)
    assert "".join(deltas) + tail == " 好的😀"


def test_special_tokens_are_skipped_mid_stream():
    tok = ByteTokenizer()
    ids = [*text_ids("a"), EOS, *text_ids("é")]
    deltas, tail = stream(tok, ids)
    assert "".join(deltas) + tail == "aé" == tok.decode(ids)
    assert deltas[1] == ""


# -- the real SmolLM2 tokenizer -------------------------------------------------------------------
@pytest.fixture(scope="module")
def smollm2_tokenizer(tmp_path_factory):
    from ruvllm.plugins import get_registry
    from ruvllm.registry import resolve

    registry = get_registry()
    cls = registry.backends.get("llamacpp")
    if cls is None:
        failures = "; ".join(f"{f.plugin}: {f.reason}" for f in registry.failures) or "none"
        pytest.skip(f"the llamacpp backend is not installed (plugin failures: {failures})")
    reason = cls.unavailable_reason()
    if reason:
        pytest.skip(f"the llamacpp backend is unavailable: {reason}")
    backend = cls.load(resolve("default", tmp_path_factory.mktemp("cache")), {})
    yield backend.tokenizer
    backend.close()


REAL_CORPUS = [
    "Hello! 😀 How are you? 👋🏽",
    "中文测试：机器学习模型。日本語のテキスト、한국어 텍스트",  # noqa: RUF001
    "🎉🎉 emoji run 🤖🧠💡 with accents: naïve café",
    "Ελληνικά και русский текст ✓ ∑ → ∞",
]


@pytest.mark.parametrize("text", REAL_CORPUS)
def test_real_smollm2_tokens_stream_exactly(smollm2_tokenizer, text):
    tok = smollm2_tokenizer
    ids = tok.encode(text, add_special=False)
    assert len(ids) > 3
    deltas, tail = stream(tok, ids)
    assert "".join(deltas) + tail == tok.decode(ids)
    assert tok.decode(ids) == text
    assert not any(REPLACEMENT in d for d in deltas)
    assert tail == ""


def test_real_smollm2_splits_some_emoji_across_tokens(smollm2_tokenizer):
    """The corpus above only tests something if the tokenizer does split characters."""
    tok = smollm2_tokenizer
    ids = tok.encode("🤖🧠💡", add_special=False)
    assert any(REPLACEMENT in tok.decode([i]) for i in ids)


def test_common_prefix_finds_the_first_difference_past_whole_runs_and_within_limits():
    from ruvllm.tokenizer import common_prefix

    a = list(range(200))
    b = [*range(150), -1, *range(151, 200)]
    assert common_prefix(a, b) == 150  # past two 64-token runs, then token by token
    assert common_prefix(a, tuple(b)) == 150  # a list and a tuple compare by value
    assert common_prefix(a, a) == 200 and common_prefix(a, a[:70]) == 70
    assert common_prefix(a, b, limit=100) == 100 and common_prefix(a, b, start=120) == 150
    assert common_prefix([1, 2], [3, 4]) == 0
    assert common_prefix(a, b, start=160) == 200  # compared from start: the caller matched what lies before
