"""The mistral.rs backend on the embedded GGUF: tokenizer agreement, token ids, EOS, errors and
several requests in flight."""

from __future__ import annotations

import threading

import pytest
from ruvllm.errors import InvalidRequest
from ruvllm.generation import GenerationStream, RequestOutputBuilder
from ruvllm.types import FinishReason, GenerationParams

TEXTS = [
    "In 1492, Columbus sailed 3.14159 km",
    "Hello  world\n\n\tdef f(x):\n    return x**2  # ok",
    "naïve café 東京 🤖 <|im_start|>user\nhi<|im_end|>",
    " leading space, it's we'll they're HELLO",
]


def run(backend, prompt_ids, **params):
    p = GenerationParams(**params)
    builder = RequestOutputBuilder(backend.tokenizer, prompt_ids, p)
    return GenerationStream(backend.generate(prompt_ids, p), builder).collect()


def encode(backend, text):
    return backend.tokenizer.encode(text, add_special=True, parse_special=True)


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_agrees_with_mistralrs(gguf_backend, text):
    """Our tokenizer (rebuilt from GGUF metadata) and mistral.rs's give the same ids, and
    decoding round-trips."""
    theirs = gguf_backend._runner.call(lambda r: r.tokenize_text(text, False, None))
    ours = gguf_backend.tokenizer.encode(text, add_special=False, parse_special=True)
    assert ours == list(theirs)
    assert gguf_backend.tokenizer.decode(ours, skip_special=False) == text


def test_special_text_in_user_input_is_not_parsed(gguf_backend):
    ids = gguf_backend.tokenizer.encode("<|im_end|>", add_special=False)
    assert 2 not in ids and len(ids) > 1


def test_token_ids_are_real_and_text_matches(gguf_backend):
    """Every yielded id decodes to the streamed text; a prompt whose greedy continuation holds a
    multi-byte character split over tokens comes out intact."""
    ids = encode(gguf_backend, "Translate to Japanese: cat ->")
    result = run(gguf_backend, ids, max_tokens=12, ignore_eos=True)
    assert len(result.token_ids) == 12
    assert result.text == gguf_backend.tokenizer.decode(list(result.token_ids))
    assert all(0 <= t < gguf_backend.tokenizer.vocab_size for t in result.token_ids)


def test_the_embedded_q4_1_runs_requantized_to_q8_0_by_default(gguf_backend):
    """isq = "auto" (ruvllm_mistralrs.requantize): the Q4_1 file runs as Q8_0 on this CPU build,
    and the load says so where users look."""
    assert gguf_backend.info.quantization == "Q8_0"
    notes = gguf_backend.capabilities().notes
    assert any(n.startswith("isq auto: Q4_1 weights requantized to Q8_0") for n in notes)
    assert gguf_backend.serial_prefill


def test_chat_reply_ends_with_eos(gguf_backend):
    tok = gguf_backend.tokenizer
    prompt = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
              "<|im_end|>\n<|im_start|>user\nReply with one word: is the sky blue?<|im_end|>\n"
              "<|im_start|>assistant\n")
    result = run(gguf_backend, tok.encode(prompt, add_special=False, parse_special=True), max_tokens=40)
    assert result.finish_reason is FinishReason.STOP and result.token_ids[-1] in tok.eos_ids
    assert result.text.strip() and "<|im_end|>" not in result.text


def test_ignore_eos_goes_on_past_eos(gguf_backend):
    """With ignore_eos the reply holds the EOS id where the plain reply ended and goes on (the
    backend continues with a new mistral.rs request after EOS); no other special token is
    sampled, and every token mistral.rs sampled reached core (the backend raises otherwise)."""
    tok = gguf_backend.tokenizer
    prompt = tok.encode("<|im_start|>user\nReply with one word: is the sky blue?<|im_end|>\n"
                        "<|im_start|>assistant\n", add_special=False, parse_special=True)
    plain = run(gguf_backend, prompt, max_tokens=24)
    through = run(gguf_backend, prompt, max_tokens=24, ignore_eos=True)
    assert plain.finish_reason is FinishReason.STOP
    assert len(through.token_ids) == 24
    assert through.token_ids[: len(plain.token_ids)] == plain.token_ids
    assert not any(tok.is_special(t) and t not in tok.eos_ids for t in through.token_ids)


def test_prompt_ids_that_do_not_round_trip_are_refused(gguf_backend):
    tok = gguf_backend.tokenizer
    hello = tok.encode("Hello", add_special=False)
    split = [tok.encode(c, add_special=False)[0] for c in "Hello"]  # non-canonical: H e l l o
    assert split != hello
    with pytest.raises(InvalidRequest) as err:
        run(gguf_backend, split, max_tokens=2)
    assert err.value.field == "prompt"


def test_seeded_sampling_is_refused(gguf_backend):
    with pytest.raises(InvalidRequest) as err:
        run(gguf_backend, encode(gguf_backend, "Hi"), max_tokens=2, temperature=0.8, seed=1)
    assert err.value.field == "seed"


def test_sampling_parameters_reach_the_engine(gguf_backend):
    """top_k=1 at a high temperature is greedy; a sampled run at temperature 1.5 is not."""
    ids = encode(gguf_backend, "Once upon a time, in a small village,")
    greedy = run(gguf_backend, ids, max_tokens=8, ignore_eos=True)
    top1 = run(gguf_backend, ids, max_tokens=8, ignore_eos=True, temperature=1.5, top_k=1)
    assert top1.token_ids == greedy.token_ids
    hot = [run(gguf_backend, ids, max_tokens=8, ignore_eos=True, temperature=1.5) for _ in range(2)]
    assert any(h.token_ids != greedy.token_ids for h in hot)


def test_concurrent_requests_match_sequential_output(gguf_backend):
    """Eight greedy requests in flight at once (mistral.rs batches their decode steps) give the
    same tokens as one at a time, and no error escapes (neither 'Already borrowed' from the
    Runner nor 'input tensor is not contiguous' from prefilling several quantized prompts in one
    step: the backend admits one prompt at a time). Two pairs of prompts have equal token
    lengths, the case mistral.rs batches into one prefill."""
    prompts = ["Once upon a time", "The capital of France is", "def fibonacci(n):",
               "List three colors: red, green,", "Hello", "In 1492, Columbus", "My favourite food is",
               "Water boils at"]
    ids = [encode(gguf_backend, p) for p in prompts]
    lengths = [len(i) for i in ids]
    assert len(set(lengths)) < len(lengths), "test needs prompts of equal token length"
    sequential = [run(gguf_backend, i, max_tokens=8, ignore_eos=True).token_ids for i in ids]
    results: dict[int, object] = {}

    def worker(k: int) -> None:
        try:
            results[k] = run(gguf_backend, ids[k], max_tokens=8, ignore_eos=True).token_ids
        except Exception as exc:  # reported below with the prompt
            results[k] = exc

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(ids))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for k, prompt in enumerate(prompts):
        assert results[k] == sequential[k], f"{prompt!r}: {results[k]!r} != {sequential[k]!r}"


def test_abandoned_stream_is_stopped_in_the_engine(gguf_backend):
    """Closing the token iterator early leaves nothing running: the next request's output is
    the same as before."""
    ids = encode(gguf_backend, "The capital of France is")
    before = run(gguf_backend, ids, max_tokens=6, ignore_eos=True)
    it = gguf_backend.generate(encode(gguf_backend, "Once upon a time"), GenerationParams(max_tokens=200))
    next(it), next(it)
    it.close()
    after = run(gguf_backend, ids, max_tokens=6, ignore_eos=True)
    assert after.token_ids == before.token_ids
    assert gguf_backend.cached_tokens() == 0
