"""Generation on the embedded model: parity with llama-cpp-python, chat, isolation, limits."""

from __future__ import annotations

import llama_cpp
import pytest
from ruvllm import LLM
from ruvllm.chat import TemplateOptions
from ruvllm.types import FinishReason, GenerationParams

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "List three colours of the rainbow:\n1.",
    "Le petit chat est",
]


@pytest.fixture(scope="module")
def reference(model_path, test_options):
    """llama-cpp-python's own high-level API on the same file and settings."""
    threads = test_options["n_threads"]
    ref = llama_cpp.Llama(str(model_path), n_ctx=test_options["n_ctx"], n_threads=threads,
                          n_threads_batch=threads, verbose=False)
    yield ref
    ref.close()


def _reference_tokens(ref: llama_cpp.Llama, prompt_ids: list[int], n: int) -> list[int]:
    """Greedy tokens of Llama.generate (the loop create_completion runs), up to EOS."""
    out: list[int] = []
    ref.reset()
    for token in ref.generate(prompt_ids, temp=0.0, top_k=40, top_p=0.95, min_p=0.05, reset=True):
        out.append(token)
        if llama_cpp.llama_vocab_is_eog(ref._model.vocab, token) or len(out) == n:
            break
    return out


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_llama_cpp_python(llm, reference, prompt):
    ids = llm.encode(prompt)
    assert ids == reference.tokenize(prompt.encode(), add_bos=True)
    ours = llm.generate(ids, max_tokens=32)
    theirs = reference.create_completion(ids, temperature=0, max_tokens=32)
    assert ours.text == theirs["choices"][0]["text"]
    expected = _reference_tokens(reference, ids, 32)
    assert list(ours.token_ids) == expected
    assert ours.usage.completion_tokens == len(expected)
    # create_completion counts the tokens it returned text for (it drops a final EOS).
    assert theirs["usage"]["completion_tokens"] == len(expected) - (ours.finish_reason is FinishReason.STOP)


def test_chat_uses_the_models_template_and_stops_on_eos(llm):
    result = llm.chat([{"role": "user", "content": "What is the capital of France? Answer in one word."}],
                      max_tokens=48)
    assert result.finish_reason is FinishReason.STOP
    assert result.stop_reason in llm.tokenizer.eos_ids
    assert "Paris" in result.text
    assert "<|im_end|>" not in result.text


def test_chat_prompt_continues_a_final_assistant_message_unless_told(llm):
    """The Python API renders as the server does (ruvllm.chat.TemplateOptions): a final assistant
    message is continued by default, closed with a new answer's header when asked."""
    messages = [{"role": "user", "content": "List three colours."},
                {"role": "assistant", "content": "1. Red\n2."}]
    continued = llm.chat_prompt(messages)
    closed = llm.chat_prompt(messages, TemplateOptions(continue_final_message=False))
    assert llm.tokenizer.decode(continued).endswith("1. Red\n2.")
    assert closed[:len(continued)] == continued and len(closed) > len(continued)


def test_isolation_same_prompt_after_a_long_other_prompt(llm):
    a = "The three primary colours are"
    long_b = " ".join(["Once upon a time in a faraway land there lived a dragon."] * 18)
    first = llm.generate(a, max_tokens=24, ignore_eos=True)
    assert llm.backend.cached_tokens() == 0
    other = llm.generate(long_b, max_tokens=24, ignore_eos=True)
    assert other.usage.prompt_tokens > 200
    assert llm.backend.cached_tokens() == 0
    again = llm.generate(a, max_tokens=24, ignore_eos=True)
    assert again.token_ids == first.token_ids and again.text == first.text
    assert llm.backend.cached_tokens() == 0 and llm.backend.last_reused_tokens == 0


def test_early_close_still_clears_the_kv(llm):
    tokens = iter(llm.stream("Count: one, two, three,", max_tokens=20))
    next(tokens)
    next(tokens)
    # Mid-request the KV holds the prompt and the evaluated tokens...
    assert llm.backend.cached_tokens() > 5
    tokens.close()
    # ...and a request abandoned by its caller frees it.
    assert llm.backend.cached_tokens() == 0


def test_streaming_logprobs_and_text(llm):
    params = GenerationParams(max_tokens=12, logprobs=3, ignore_eos=True)
    stream = llm.stream("Water boils at", params)
    pieces = list(stream)
    result = stream.result
    assert "".join(p.text for p in pieces) == result.text
    assert [p.token_id for p in pieces] == list(result.token_ids)
    for p in pieces:
        # Greedy: the chosen token is the most likely one, and its logprob is reported.
        assert p.top_logprobs[0].token_id == p.token_id
        assert p.logprob == pytest.approx(p.top_logprobs[0].logprob)
        assert p.logprob <= 0.0


def test_seeded_sampling_is_reproducible(llm):
    params = GenerationParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)
    assert llm.generate("A poem about the sea:", params).token_ids == \
        llm.generate("A poem about the sea:", params).token_ids


def test_backend_stops_when_the_context_is_full(llm, model_path, test_options):
    options = {**test_options, "n_ctx": 32, "n_batch": 64}
    with LLM(model_path.as_posix(), backend="llamacpp", options=options) as small:
        n_ctx = small.info.context_length
        # llama.cpp pads the window (to a multiple of 256); the backend reports the real size.
        assert n_ctx == small.backend.n_ctx >= 32
        ids = small.encode(" ".join(str(i) for i in range(400)))[: n_ctx - 10]
        produced = list(small.backend.generate(ids, GenerationParams(max_tokens=1)))
        # The backend itself generates until the window is full (core enforces max_tokens).
        assert len(produced) == 10
        result = small.generate(ids, max_tokens=10, ignore_eos=True)
        assert result.finish_reason is FinishReason.LENGTH
        assert list(result.token_ids) == [t.token_id for t in produced]
        assert small.backend.cached_tokens() == 0
    # The prompt is longer than n_batch=64, so it was prefilled in chunks: same tokens as a
    # one-chunk prefill (n_batch 512) in the larger context.
    assert len(ids) > 3 * 64
    assert llm.generate(ids, max_tokens=10, ignore_eos=True).token_ids == result.token_ids
