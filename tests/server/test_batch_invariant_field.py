"""A request's ``batch_invariant``: refused by name where the engine cannot keep it (the default
llamacpp server), served where it can (a server started in the mode), with the same tokens and
logprobs alone and beside other requests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from server_helpers import API_KEY, start_server


@pytest.mark.parametrize("surface", ["completions", "chat"])
def test_the_default_server_refuses_it_naming_the_field(client, model_name, surface) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        if surface == "chat":
            client.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=2, extra_body={"batch_invariant": True})
        else:
            client.completions.create(model=model_name, prompt="Hi", max_tokens=2,
                                      extra_body={"batch_invariant": True})
    assert refused.value.body["param"] == "batch_invariant"
    assert "--batch-invariant" in refused.value.body["message"]


def test_a_server_in_the_mode_answers_the_same_alone_and_beside_others() -> None:
    running = start_server(engine_options={"batch_invariant": True, "max_num_seqs": 8})
    try:
        client = openai.OpenAI(base_url=running.base_url, api_key=API_KEY, max_retries=0, timeout=120)
        model = client.models.list().data[0].id

        def ask(prompt: str, tokens: int = 8):
            r = client.completions.create(model=model, prompt=prompt, max_tokens=tokens, temperature=0,
                                          logprobs=1, extra_body={"batch_invariant": True})
            return r.choices[0].text, r.choices[0].logprobs.token_logprobs

        alone = ask("The capital of France is")
        others = ["Once upon a time", "def fibonacci(n):", "Dear Sir or Madam,", "The quick brown fox"]
        with ThreadPoolExecutor(5) as pool:
            crowd = [pool.submit(ask, p, 16) for p in others]
            beside = pool.submit(ask, "The capital of France is")
            [f.result() for f in crowd]
        assert beside.result() == alone
    finally:
        running.stop()
