"""Assistant prefill: a conversation that ends in an assistant message is continued from it.

Anthropic's Messages API, Ollama's chat and llama-server do it with no field; vLLM's
``continue_final_message`` / ``add_generation_prompt`` say it on chat and ``/tokenize``. Every surface
must run the same prompt: the continued message's ids, with no end-of-turn after them.
"""

from __future__ import annotations

import anthropic
import httpx
import ollama
import openai
import pytest
from server_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PREFILL = [{"role": "user", "content": "List three colours, one a line."},
           {"role": "assistant", "content": "1. Red\n2."}]
NEW = 8


def _tokens(server, **body) -> list[int]:
    answer = httpx.post(server.url + "/tokenize", json={"messages": PREFILL, **body}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    return answer.json()["tokens"]


def test_the_prompt_stops_inside_the_final_message(server):
    continued = _tokens(server)
    assert _tokens(server, continue_final_message=True, add_generation_prompt=False) == continued
    ended = _tokens(server, add_generation_prompt=False)
    closed = _tokens(server, continue_final_message=False)
    # Closed, the turn's end follows the same ids (vLLM's add_generation_prompt: false), then a
    # new answer's header.
    assert ended[:len(continued)] == continued and len(ended) > len(continued)
    assert closed[:len(ended)] == ended and len(closed) > len(ended)


def test_every_surface_continues_the_same_prompt(server, client, model_name):
    """Greedy answers are the completion of the continued prompt's ids, the same on all surfaces."""
    ids = _tokens(server)
    tail = httpx.post(server.url + "/detokenize", json={"tokens": ids[-4:]}, headers=AUTH).json()["prompt"]
    assert tail.endswith("Red\n2."), tail
    # Warm first: a prefix-cache hit can round a greedy token differently from a cold prefill.
    client.completions.create(model=model_name, prompt=ids, max_tokens=1, temperature=0)
    expected = client.completions.create(model=model_name, prompt=ids, max_tokens=NEW, temperature=0,
                                         extra_body={"ignore_eos": True}).choices[0].text
    assert expected.strip()

    chat = client.chat.completions.create(model=model_name, messages=PREFILL, max_tokens=NEW, temperature=0,
                                          extra_body={"ignore_eos": True})
    assert chat.choices[0].message.content == expected
    assert chat.usage.prompt_tokens == len(ids)

    claude = anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=120)
    message = claude.messages.create(model=model_name, max_tokens=NEW, messages=PREFILL,
                                     extra_body={"temperature": 0})
    # Anthropic's and Ollama's APIs cannot ignore EOS: their answers may end sooner.
    assert message.content[0].text and expected.startswith(message.content[0].text)
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens == len(ids)
    assert claude.messages.count_tokens(model=model_name, messages=PREFILL).input_tokens == len(ids)

    llama = ollama.Client(host=server.url, headers=AUTH, timeout=120)
    answer = llama.chat(model=model_name, messages=PREFILL,
                        options={"temperature": 0, "num_predict": NEW})
    assert answer.message.content and expected.startswith(answer.message.content)
    assert answer.prompt_eval_count == len(ids)


def test_a_new_answer_after_the_final_message_when_asked(server, client, model_name):
    closed = _tokens(server, continue_final_message=False)
    chat = client.chat.completions.create(model=model_name, messages=PREFILL, max_tokens=2, temperature=0,
                                          extra_body={"continue_final_message": False})
    assert chat.usage.prompt_tokens == len(closed)


@pytest.mark.parametrize("extra, field", [
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ({"response_format": {"type": "json_object"}}, "response_format"),
    ({"guided_choice": ["Blue", "Green"]}, "guided_choice"),
])
def test_what_cannot_be_continued_is_a_400_naming_the_field(client, model_name, extra, field):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=model_name, messages=PREFILL, max_tokens=2, extra_body=extra)
    assert err.value.body["param"] == field, err.value.body
