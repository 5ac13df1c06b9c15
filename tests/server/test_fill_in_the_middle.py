"""Fill-in-the-middle: OpenAI's ``suffix`` on ``/v1/completions`` and Ollama's on ``/api/generate``,
through the official clients.

The embedded SmolLM2 has no fill-in-the-middle tokens, so there a suffix is a 400 naming it. A
tiny RANDOM Qwen2 with Qwen2.5-Coder's three tokens in its vocabulary (control tokens, as that
family has them) is written at test time, as an HF directory (candle_like: the tokens found by
ruvllm.fim) and as a GGUF (llamacpp: found by llama.cpp itself). Its prompt must be
``<|fim_prefix|> prefix <|fim_suffix|> suffix <|fim_middle|>`` with the ids of those tokens as
written, and its greedy answer the completion of exactly those ids.
"""

from __future__ import annotations

import attrs
import httpx
import ollama
import openai
import pytest
from server_helpers import API_KEY, start_server
from test_server_tools_auto import _tiny_module

FIM = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")
#: Qwen2.5-Coder's repository-level pair: the project's other files go before the prefix.
REPO = ("<|repo_name|>", "<|file_sep|>")
PREFIX, SUFFIX = "def add(a, b):\n    ", "\n    return c\n"
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def _write(root, form: str):
    """The tiny model with the five tokens appended to its vocabulary; (path, their ids)."""
    from ruvllm.chat import CHATML
    from ruvllm.hf_tokenizer import CONTROL, HfTokenizer
    from ruvllm_candle_like.writers import save_hf, write_gguf

    tiny = _tiny_module()
    vocab = tiny.tiny_tokenizer()
    ids = tuple(range(len(vocab.tokens), len(vocab.tokens) + len(FIM + REPO)))
    vocab = attrs.evolve(vocab, tokens=[*vocab.tokens, *FIM, *REPO], chat_template=CHATML,
                         token_types=[*vocab.token_types, *[CONTROL] * len(FIM + REPO)])
    # Room for llama-server's batch (2048 tokens) and the other files beyond it (/infill).
    cfg = attrs.evolve(tiny.tiny_config("qwen2", len(vocab.tokens)), max_position_embeddings=4096)
    weights = tiny.tiny_weights(cfg, seed=0)
    if form == "gguf":
        return write_gguf(root / "tiny-fim.gguf", cfg, weights, vocab), ids
    tokenizer = HfTokenizer.from_gguf_vocab(vocab, vocab_size=cfg.vocab_size)
    return save_hf(root / "tiny-fim", cfg, weights, tokenizer, chat_template=CHATML), ids


@pytest.fixture(scope="module", params=["candle_like", "llamacpp"])
def fim_server(request, tmp_path_factory):
    backend = request.param
    path, ids = _write(tmp_path_factory.mktemp("fim"), "gguf" if backend == "llamacpp" else "hf")
    running = start_server(backend=backend, model=str(path), server={"max_tokens_limit": 64})
    yield running, ids
    running.stop()


def _tokens(server, text: str) -> list[int]:
    r = httpx.post(server.url + "/tokenize", json={"prompt": text, "add_special_tokens": False}, headers=AUTH)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_the_prompt_is_prefix_suffix_middle_and_the_answer_fills_it(fim_server):
    server, (pre, suf, mid, _, _) = fim_server
    client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
    model = client.models.list().data[0].id
    expected = [pre, *_tokens(server, PREFIX), suf, *_tokens(server, SUFFIX), mid]
    filled = client.completions.create(model=model, prompt=PREFIX, suffix=SUFFIX, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert filled.usage.prompt_tokens == len(expected)
    as_ids = client.completions.create(model=model, prompt=expected, max_tokens=8, temperature=0,
                                       extra_body={"ignore_eos": True})
    assert filled.choices[0].text == as_ids.choices[0].text
    llama = ollama.Client(host=server.url, headers=AUTH)
    generated = llama.generate(model=model, prompt=PREFIX, suffix=SUFFIX,
                               options={"temperature": 0, "num_predict": 8})
    assert generated.prompt_eval_count == len(expected)
    assert as_ids.choices[0].text.startswith(generated.response)  # Ollama's stops at EOS


@pytest.mark.parametrize("body, param", [
    ({"prompt": PREFIX, "suffix": SUFFIX, "echo": True}, "echo"),
    ({"prompt": [1, 2, 3], "suffix": SUFFIX}, "prompt"),
])
def test_what_a_fill_in_cannot_take_is_a_400_naming_it(fim_server, body, param):
    server, _ = fim_server
    r = httpx.post(server.url + "/v1/completions", json={**body, "max_tokens": 2}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    r = httpx.post(server.url + "/api/generate", json={"model": "x", "prompt": PREFIX, "suffix": SUFFIX,
                                                       "raw": True}, headers=AUTH)
    assert r.status_code == 400 and r.json()["error"].startswith("raw:"), r.text


def test_a_model_without_the_tokens_refuses_a_suffix_by_name(client, model_name, server):
    with pytest.raises(openai.BadRequestError, match="no fill-in-the-middle tokens") as err:
        client.completions.create(model=model_name, prompt=PREFIX, suffix=SUFFIX, max_tokens=2)
    assert err.value.body["param"] == "suffix"
    with pytest.raises(ollama.ResponseError, match=r"^suffix: this model has no fill-in-the-middle"):
        ollama.Client(host=server.url, headers=AUTH).generate(model=model_name, prompt=PREFIX, suffix=SUFFIX)


def test_llama_servers_infill_lays_out_the_project_the_line_and_the_gap(fim_server):
    """llama-server's ``/infill`` as llama.vim sends it: the other files first (the project and
    each file under its name, then the current one), the prefix followed by the cursor line,
    the suffix, the middle; the answer is the completion of exactly those ids."""
    server, (pre, suf, mid, repo, sep) = fim_server
    line, other = "    c = ", "def sub(a, b):\n    return a - b\n"
    expected = [repo, *_tokens(server, "myproject\n"), sep, *_tokens(server, "util.py\n"),
                *_tokens(server, other), sep, *_tokens(server, "filename\n"),
                pre, *_tokens(server, PREFIX), *_tokens(server, line), suf, *_tokens(server, SUFFIX), mid]
    # llama.vim's chain has no temperature: its top_k 1 is what makes this answer greedy.
    body = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "prompt": line, "n_predict": 8, "top_k": 1,
            "ignore_eos": True, "input_extra": [{"filename": "util.py", "text": other}],
            "samplers": ["top_k", "top_p", "infill"], "cache_prompt": True, "t_max_prompt_ms": 500}
    plain = {"prompt": expected, "n_predict": 8, "temperature": 0, "ignore_eos": True}
    httpx.post(server.url + "/completion", json=plain, headers=AUTH, timeout=60)  # warm: both reuse its KV
    filled = httpx.post(server.url + "/infill", json=body, headers=AUTH, timeout=60)
    assert filled.status_code == 200, filled.text
    as_ids = httpx.post(server.url + "/completion", json=plain, headers=AUTH, timeout=60)
    assert filled.json()["tokens_evaluated"] == len(expected) == as_ids.json()["tokens_evaluated"]
    assert filled.json()["content"] == as_ids.json()["content"]
