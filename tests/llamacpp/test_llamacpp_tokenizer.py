"""The llama.cpp tokenizer against ruvllm's Tokenizer contract."""

from __future__ import annotations

import pytest
from ruvllm.tokenizer import IncrementalDetokenizer, Tokenizer

TEXTS = [
    "Hello, world! Plain ASCII with  double  spaces\tand tabs.\n",
    "Accents: héllo wörld, façade, naïve, Ærøskøbing, ñandú",
    "CJK: 日本語のテキスト、中文文本\uff0c한국어 텍스트",
    "Emoji: 🎉🚀👩‍👩‍👧 ok 🇫🇷",
    " leading space, trailing space ",
]


def test_implements_the_protocol(llm):
    tok = llm.tokenizer
    assert isinstance(tok, Tokenizer)
    assert tok.vocab_size == llm.info.vocab_size == 49152


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(llm, text):
    tok = llm.tokenizer
    ids = tok.encode(text, add_special=False)
    assert ids
    assert tok.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS[2:4])
def test_incremental_detokenizer_equals_whole_decode(llm, text):
    tok = llm.tokenizer
    ids = tok.encode(text, add_special=False)
    # These texts really do split characters across tokens: a lone token decodes to U+FFFD.
    assert any("\ufffd" in tok.decode([i]) for i in ids)
    prompt = tok.encode("Say:", add_special=False)
    detok = IncrementalDetokenizer(tok, context=prompt)
    streamed = "".join(detok.push(i) for i in ids) + detok.flush()
    assert streamed == tok.decode(ids) == text


def test_partial_character_decodes_to_replacement(llm):
    tok = llm.tokenizer
    ids = tok.encode("🎉", add_special=False)
    assert len(ids) > 1
    assert tok.decode(ids[:-1]).endswith("\ufffd")
    assert tok.decode(ids) == "🎉"


def test_special_tokens(llm):
    tok = llm.tokenizer
    st = llm.info.special_tokens
    im_end = tok.encode("<|im_end|>", add_special=False, parse_special=True)
    assert len(im_end) == 1
    im_end_id = im_end[0]
    # Without parse_special the same text is ordinary characters (user text can't inject it).
    assert len(tok.encode("<|im_end|>", add_special=False)) > 1
    assert tok.is_special(im_end_id)
    assert not tok.is_special(tok.encode("Hello", add_special=False)[0])
    assert im_end_id in tok.eos_ids and tok.eos_ids[0] == im_end_id
    assert st.eos_ids == tok.eos_ids and st.eos_text == "<|im_end|>"
    assert tok.token_text(im_end_id) == "<|im_end|>"
    assert tok.decode([im_end_id]) == ""
    assert tok.decode([im_end_id], skip_special=False) == "<|im_end|>"


def test_bos_is_none_when_the_model_does_not_add_it(llm):
    tok = llm.tokenizer
    # SmolLM2's GGUF says tokenizer.ggml.add_bos_token = false.
    assert llm.backend.metadata["tokenizer.ggml.add_bos_token"] == "false"
    assert tok.bos_id is None and llm.info.special_tokens.bos_id is None
    assert tok.encode("Hi", add_special=True) == tok.encode("Hi", add_special=False)


def test_model_info_from_gguf(llm):
    info = llm.info
    assert info.architecture == "llama"
    assert info.context_length == llm.backend.n_ctx
    assert info.quantization == "Q4_1"
    assert info.parameters and 100e6 < info.parameters < 200e6
    assert info.chat_template and "<|im_start|>" in info.chat_template


def test_encodes_on_many_threads_beside_a_decode(llm):
    """``thread_safe``: the serving engine tokenizes prompts off its model thread, while a forward
    pass may run there; encodes on four threads, beside generation, agree with one thread's."""
    import threading

    from ruvllm import GenerationParams

    tok = llm.tokenizer
    assert tok.thread_safe
    want = [tok.encode(t, add_special=True) for t in TEXTS]
    got: list[list[list[int]]] = []
    stop = threading.Event()

    def encode_many() -> None:
        out = []
        while not stop.is_set() or not out:
            out.append([tok.encode(t, add_special=True) for t in TEXTS])
        got.extend(out)

    workers = [threading.Thread(target=encode_many) for _ in range(4)]
    for w in workers:
        w.start()
    try:
        llm.generate("Once upon a time", GenerationParams(max_tokens=8))
    finally:
        stop.set()
        for w in workers:
            w.join()
    assert got and all(ids == want for ids in got)


def test_a_closed_model_refuses_to_encode(test_options):
    from ruvllm import LLM
    from ruvllm.errors import BackendError

    llm = LLM(backend="llamacpp", options=test_options)
    tok = llm.tokenizer
    assert tok.encode("hi", add_special=False)
    llm.close()
    with pytest.raises(BackendError, match="closed"):
        tok.encode("hi")
