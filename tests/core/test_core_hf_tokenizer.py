"""Core's one ``tokenizers``-based tokenizer: ids equal llama.cpp's on the embedded GGUF, decode
is exact, and a Hugging Face directory made by ``ruvllm convert`` gives the same tokenizer."""

from __future__ import annotations

import json
import re
import shutil
from concurrent.futures import ThreadPoolExecutor

import gguf
import pytest
from ruvllm.errors import ModelLoadError
from ruvllm.hf_tokenizer import BYTE, CONTROL, NORMAL, UNKNOWN, GgufVocab, HfTokenizer, byte_level_alphabet
from ruvllm.registry import embedded_model_path
from ruvllm.tokenizer import IncrementalDetokenizer, Tokenizer, text_bytes, token_piece

CORPUS = [
    "Hello world",
    "The quick brown fox jumps over the lazy dog. 1234567 3.14159",
    "def f(x):\n    return {'k': x**2}  # square\n\n\tindented()",
    "for (int i = 0; i < n; ++i) { sum += a[i]; }",
    "Café naïve résumé Ünïcödé façade ÀÉÎÕÜ",
    "日本語のテキスト、中文字符\uff0c한국어",
    "emoji 🙂👍🏽 🚀🔥 👨‍👩‍👧",
    "  leading  spaces   and\n\n\n  \t\ttabs  ",
    "it's don't we'll I'M they've",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "Здравствуй, мир! \u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5",
    "",
]


@pytest.fixture(scope="module")
def metadata() -> dict:
    reader = gguf.GGUFReader(embedded_model_path())
    return {k: f.contents() for k, f in reader.fields.items()
            if k.startswith(("tokenizer.", "general.")) or k.endswith(".vocab_size")}


@pytest.fixture(scope="module")
def tok(metadata) -> HfTokenizer:
    return HfTokenizer.from_gguf_metadata(metadata)


@pytest.fixture(scope="module")
def llama_vocab():
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable")
    ll = llama_cpp.Llama(str(embedded_model_path()), vocab_only=True, verbose=False)
    yield ll
    ll.close()


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    convert = pytest.importorskip("ruvllm_candle_like.convert", reason="needs `ruvllm convert` (candle_like)")
    return convert.gguf_to_hf(embedded_model_path(), tmp_path_factory.mktemp("hf"), dtype="bfloat16",
                              overwrite=True)


def test_gguf_facts(tok, metadata):
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == 49152 and tok.bos_id == 1 and tok.eos_ids == (2,)
    assert not tok.add_bos  # SmolLM2's GGUF says tokenizer.ggml.add_bos_token = false
    assert tok.chat_template == metadata["tokenizer.chat_template"]
    assert tok.byte_level
    assert tok.is_special(0) and tok.is_special(1) and tok.is_special(2) and not tok.is_special(504)


@pytest.mark.parametrize("special", [False, True], ids=["plain", "parse_special"])
@pytest.mark.parametrize("text", CORPUS)
def test_ids_equal_llama_cpp(tok, llama_vocab, text, special):
    expected = llama_vocab.tokenize(text.encode(), add_bos=True, special=special)
    assert tok.encode(text, parse_special=special) == expected
    assert tok.decode(tok.encode(text, parse_special=special), skip_special=False) == text


def test_special_text_in_user_input_is_not_a_control_token(tok):
    text = "<|im_start|>user"
    assert tok.encode(text, parse_special=True)[0] == 1
    plain = tok.encode(text)
    assert 1 not in plain and tok.decode(plain) == text
    assert tok.decode(tok.encode(text, parse_special=True)) == "user"
    assert tok.token_text(2) == "<|im_end|>"


def test_threads_encoding_both_ways_at_once_each_get_their_own_way(tok):
    """Both ways share one tokenizer's flag (set under a lock): request threads encoding user
    text while others encode templated prompts never get each other's reading of special text."""
    text = "<|im_start|>user hello<|im_end|>" * 20
    parsed, plain = tok.encode(text, parse_special=True), tok.encode(text)
    assert parsed != plain

    def encode(i: int) -> bool:
        special = i % 2 == 0
        return tok.encode(text, parse_special=special) == (parsed if special else plain)

    with ThreadPoolExecutor(8) as pool:
        assert all(pool.map(encode, range(400)))
    assert not tok.impl.encode_special_tokens  # left as built, for a tokenizer.json saved from it


@pytest.mark.parametrize("text", CORPUS)
def test_decode_is_exact_and_streaming_agrees(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    detok = IncrementalDetokenizer(tok)
    assert "".join(detok.push(i) for i in ids) + detok.flush() == text


def test_token_bytes_rebuild_utf8(tok):
    table = tok.token_bytes()
    assert len(table) == tok.vocab_size
    for text in CORPUS:
        ids = tok.encode(text, parse_special=True)
        assert b"".join(table[i] for i in ids) == text.encode()


def test_decode_bytes_gives_each_tokens_exact_bytes(tok):
    """Where ``decode`` shows a piece of a character as U+FFFD, ``decode_bytes`` keeps its byte,
    so llama-server's ``with_pieces`` and the infill sampler compare real texts (two different
    byte tokens are not the same "\ufffd")."""
    table = tok.token_bytes()
    ids = tok.encode("🚀 <|im_end|>", add_special=False, parse_special=True)
    assert [tok.decode_bytes([i], skip_special=False) for i in ids] == [table[i] for i in ids]
    assert tok.decode_bytes(ids, skip_special=False) == "🚀 <|im_end|>".encode()
    assert tok.decode_bytes(ids) == "🚀 ".encode()  # the control token left out, as decode does
    first, second = (tok.decode_bytes([i]) for i in tok.encode("🚀", add_special=False)[:2])
    assert first != second and b"\xef\xbf\xbd" not in first + second
    assert token_piece(tok, ids[0]) == list(first) and text_bytes(tok, ids[-1]) == b""


def test_a_split_character_decodes_to_replacement_then_whole(tok):
    ids = tok.encode("🚀")
    assert len(ids) > 1  # the rocket is split over byte tokens
    assert tok.decode(ids[:1]).endswith("\ufffd")
    assert tok.decode(ids) == "🚀"


def test_from_hf_dir_written_by_convert(tok, hf_dir, metadata):
    hf = HfTokenizer.from_hf_dir(hf_dir)
    assert (hf.bos_id, hf.eos_ids, hf.add_bos, hf.vocab_size) == (1, (2,), False, 49152)
    assert hf.chat_template == metadata["tokenizer.chat_template"]
    for text in CORPUS:
        for special in (False, True):
            assert hf.encode(text, parse_special=special) == tok.encode(text, parse_special=special)
        assert hf.decode(hf.encode(text)) == text
    assert hf.special_ids == tok.special_ids


def test_hf_dir_bos_from_config_and_from_post_processor(hf_dir, tmp_path):
    """``add_bos_token`` in tokenizer_config wins; without it the post-processor decides; BOS is
    never doubled when the caller asks for no special tokens."""
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "config.json"):
        shutil.copy(hf_dir / name, tmp_path / name)
    cfg = json.loads((tmp_path / "tokenizer_config.json").read_text())
    cfg["add_bos_token"] = True
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    with_config = HfTokenizer.from_hf_dir(tmp_path)
    assert with_config.encode("Hi") == [1, *with_config.encode("Hi", add_special=False)]

    del cfg["add_bos_token"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    tj = json.loads((tmp_path / "tokenizer.json").read_text())
    tj["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]}},
    }
    (tmp_path / "tokenizer.json").write_text(json.dumps(tj))
    probed = HfTokenizer.from_hf_dir(tmp_path)
    assert probed.add_bos
    assert probed.encode("Hi") == [1, *probed.encode("Hi", add_special=False)]
    assert probed.encode("<|im_start|>Hi", add_special=False, parse_special=True)[:2] != [1, 1]


def test_hf_dir_template_files_take_precedence(hf_dir, tmp_path):
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(hf_dir / name, tmp_path / name)
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}")
    assert HfTokenizer.from_hf_dir(tmp_path).chat_template == "{{ messages[0]['content'] }}"


def test_missing_tokenizer_json_is_a_load_error(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match=re.escape("no tokenizer.json")):
        HfTokenizer.from_hf_dir(tmp_path)


def test_bad_metadata_names_the_key(metadata):
    with pytest.raises(ModelLoadError, match=re.escape("tokenizer.ggml.pre 'nonesuch' is not supported")):
        HfTokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.pre": "nonesuch"}, source="m.gguf")
    with pytest.raises(ModelLoadError, match=re.escape("tokenizer.ggml.token_type has 3 entries")):
        HfTokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.token_type": [1, 1, 1]})
    with pytest.raises(ModelLoadError, match=re.escape("tokenizer.ggml.tokens must be a non-empty list")):
        HfTokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2"})
    with pytest.raises(ModelLoadError, match=re.escape("tokenizer.ggml.model 'bert' is not supported")):
        HfTokenizer.from_gguf_metadata({**metadata, "tokenizer.ggml.model": "bert"})


def test_vocab_round_trips_through_gguf_keys(metadata):
    vocab = GgufVocab.from_metadata(metadata)
    assert GgufVocab.from_metadata(vocab.metadata()) == vocab


def test_user_defined_tokens_are_matched_but_not_special():
    """llama.cpp matches user-defined tokens whole even in plain text and never hides them."""
    tokens = ["<eos>", "<tool>", *byte_level_alphabet()]
    vocab = GgufVocab(model="gpt2", pre="gpt2", tokens=tokens, token_types=[CONTROL, 4] + [NORMAL] * 256,
                      eos_id=0)
    t = HfTokenizer.from_gguf_vocab(vocab)
    assert t.encode("a<tool>b") == [2 + ord("a"), 1, 2 + ord("b")]
    assert not t.is_special(1) and t.is_special(0)
    assert t.decode([1, 0]) == "<tool>"


# "_" stands for SentencePiece's word marker U+2581.
SPM_PIECES = [p.replace("_", "\u2581") for p in [
    "_", "t", "h", "e", "a", "s", "i", "n", "o", "r", "l", "d", "w", "_t", "he", "_the", "in", "_a", "er",
    "on", "_s", "re", "at", "_w", "or", "ld", "_wor", "_world", "ll", "_he", "_hell", "o_", "é", "日",
]]


@pytest.fixture(scope="module")
def spm_gguf(tmp_path_factory):
    """A vocabulary-only SentencePiece GGUF (Llama 2 style: byte tokens, scores, no merges, no
    add_bos_token key so llama.cpp's default applies)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + SPM_PIECES
    path = tmp_path_factory.mktemp("spm") / "spm-vocab.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_feed_forward_length(8)
    w.add_head_count(1)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_types([UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256 + [NORMAL] * len(SPM_PIECES))
    w.add_token_scores([0.0] * 259 + [-float(i) for i in range(len(SPM_PIECES))])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


SPM_CORPUS = ["hello world", "the theater is in the world", "  two  spaces", "café 日本 🙂", "a\nb\tc", "",
              "<s>hi</s>"]


@pytest.mark.parametrize("text", SPM_CORPUS)
def test_sentencepiece_gguf_equals_llama_cpp(spm_gguf, text):
    llama_cpp = pytest.importorskip("llama_cpp", reason="llama-cpp-python is not importable")
    reader = gguf.GGUFReader(spm_gguf)
    t = HfTokenizer.from_gguf_metadata({k: f.contents() for k, f in reader.fields.items()})
    ll = llama_cpp.Llama(str(spm_gguf), vocab_only=True, verbose=False)
    try:
        for special in (False, True):
            assert t.encode(text, parse_special=special) == ll.tokenize(text.encode(), add_bos=True,
                                                                        special=special)
    finally:
        ll.close()
    assert t.add_bos and not t.byte_level
    assert t.decode(t.encode(text)) == text
    table = t.token_bytes()
    # The space prefix SentencePiece adds is a real byte of the first token.
    joined = b"".join(table[i] for i in t.encode(text, add_special=False))
    assert joined == (b" " + text.encode() if text else b"")
