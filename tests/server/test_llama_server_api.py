"""llama-server's own ``/completion`` and ``/infill``, as its scripts and editor plugins call them.

There is no official Python client for llama-server's native API (llama.vim and llama.vscode
post JSON with curl and fetch), so these post JSON with httpx. On the embedded SmolLM2 through
llamacpp: a greedy ``/completion`` must be the same answer as ``/v1/completions`` on the same
prompt (the prompt warmed first, so both reuse its cached KV), in llama-server's objects; the
stream must add up to the whole answer; llama-server's editor stops must end the answer where
llama-server ends it. ``/infill``'s prompt is tested on a code model in
test_fill_in_the_middle.py (SmolLM2 has no fill-in-the-middle tokens: a 400 here).
"""

from __future__ import annotations

import json
import math
import time
import uuid
from typing import Any

import httpx
import numpy as np
import pytest
from server_helpers import API_KEY

AUTH = {"Authorization": f"Bearer {API_KEY}"}
PROMPT = "One, two, three,"
CODE = "def main():\n    x = 1\n    y = 2\n"


def post(server, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(server.url + path, json=body, headers=AUTH, timeout=120)


def complete(server, **body: Any) -> dict[str, Any]:
    r = post(server, "/completion", {"temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def openai_text(server, prompt: Any, max_tokens: int, **extra: Any) -> dict[str, Any]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    r = post(server, "/v1/completions", body)
    assert r.status_code == 200, r.text
    return r.json()


def events(r: httpx.Response) -> list[dict[str, Any]]:
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"), r.text
    return [json.loads(line[len("data: "):]) for line in r.text.splitlines() if line.startswith("data: ")]


def test_a_completion_is_the_completions_answer_in_llama_servers_objects(server):
    counting = "One, two, three, four, five, six, seven, eight, nine, ten, " * 4  # whole KV blocks
    openai_text(server, counting, 8)  # warm: both answers below reuse the prompt's cached KV
    expected = openai_text(server, counting, 8)
    got = complete(server, prompt=counting, n_predict=8, return_tokens=True)
    assert got["content"] == expected["choices"][0]["text"]
    assert got["tokens_predicted"] == len(got["tokens"]) == expected["usage"]["completion_tokens"] == 8
    assert got["tokens_evaluated"] == expected["usage"]["prompt_tokens"]
    # Warm, most of the prompt is read from the cache, and the rest computed, as llama-server counts.
    assert got["tokens_cached"] == got["timings"]["cache_n"] > 0
    assert got["timings"]["cache_n"] + got["timings"]["prompt_n"] == got["tokens_evaluated"]
    assert got["stop"] is True and got["stop_type"] == "limit" and got["stopping_word"] == ""
    assert got["generation_settings"]["n_predict"] == 8 and got["prompt"].endswith(counting)
    assert got["timings"]["predicted_n"] == 8 and got["timings"]["predicted_per_second"] > 0


def test_the_stream_adds_up_to_the_answer_and_ends_with_the_final_object(server):
    whole = complete(server, prompt=PROMPT, n_predict=8)
    parts = events(post(server, "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0,
                                                "stream": True}))
    assert "[DONE]" not in json.dumps(parts)  # llama-server's own stream has no [DONE]
    *pieces, last = parts
    assert all(p["stop"] is False and len(p["tokens"]) <= 1 for p in pieces)
    assert "".join(p["content"] for p in pieces) == whole["content"]
    assert last["stop"] is True and last["content"] == "" and last["tokens_predicted"] == 8


def test_a_stop_word_and_the_end_of_text_say_why(server):
    got = complete(server, prompt=PROMPT, n_predict=16, stop=[" five"])
    assert got["stop_type"] == "word" and got["stopping_word"] == " five"
    assert " five" not in got["content"]
    chat = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"
    ended = complete(server, prompt=chat, n_predict=64)
    assert ended["stop_type"] == "eos", ended  # the control tokens written as text were parsed


def test_prompts_are_text_ids_or_both_and_several_answer_as_a_list(server):
    ids = post(server, "/tokenize", {"prompt": PROMPT}).json()["tokens"]
    as_text = complete(server, prompt=PROMPT, n_predict=4)
    assert complete(server, prompt=ids, n_predict=4)["content"] == as_text["content"]
    head = post(server, "/tokenize", {"prompt": "One, two,"}).json()["tokens"]
    mixed = complete(server, prompt=[*head, " three,"], n_predict=4)
    assert mixed["tokens_evaluated"] == len(head) + len(post(server, "/tokenize", {
        "prompt": " three,", "add_special_tokens": False}).json()["tokens"])
    several = post(server, "/completion", {"prompt": [PROMPT, ids], "n_predict": 4, "temperature": 0}).json()
    assert [a["index"] for a in several] == [0, 1]
    # One batch computes both alike; a batch's numerics may differ from one request's (AVX2 llama.cpp).
    assert several[0]["content"] == several[1]["content"]
    # n_cmpl answers per prompt, prompt after prompt, each sampled with its own seed (seed + its rank).
    sampled = post(server, "/completion", {"prompt": [PROMPT, "My favourite animal is"], "n_predict": 8,
                                           "n_cmpl": 3, "temperature": 1.0, "seed": 7}).json()
    assert [a["index"] for a in sampled] == list(range(6))
    assert [a["tokens_evaluated"] for a in sampled[:3]] == [as_text["tokens_evaluated"]] * 3
    assert [a["generation_settings"]["seed"] for a in sampled] == [7, 8, 9] * 2
    assert len({a["content"] for a in sampled[3:]}) > 1


def test_n_predict_zero_evaluates_the_prompt_into_the_cache_and_writes_nothing(server):
    """llama.vim sends the project's files with n_predict 0 to have them cached before it asks."""
    files = f"# {uuid.uuid4().hex}\n" + "def add(a, b):\n    return a + b\n\n" * 8
    got = complete(server, prompt=files, n_predict=0, return_tokens=True)
    assert got["content"] == "" and got["tokens"] == [] and got["tokens_predicted"] == 0
    assert got["tokens_evaluated"] > 32 and got["generation_settings"]["n_predict"] == 0
    asked = complete(server, prompt=files + "def sub(a, b):", n_predict=4)
    assert asked["tokens_cached"] >= 32  # the files' whole KV blocks


def test_n_indent_ends_at_the_first_line_indented_less_and_cuts_it(server):
    """llama-server's rule for editors: lines after the first must be indented at least
    ``n_indent``; the first that is not is cut after its indentation, and the engine stops."""
    complete(server, prompt=CODE, n_predict=1)  # warm: every answer below reuses the prompt's cached KV
    free = complete(server, prompt=CODE, n_predict=40)["content"]
    lines = free.split("\n")
    short = next(k for k, line in enumerate(lines[1:], 1) if line.strip() and
                 len(line) - len(line.lstrip(" \t")) < 4)
    indent = lines[short][: len(lines[short]) - len(lines[short].lstrip(" \t"))]
    kept = "\n".join(lines[:short]) + "\n" + indent
    for stream in (False, True):
        body = {"prompt": CODE, "n_predict": 40, "temperature": 0, "n_indent": 4, "stream": stream}
        r = post(server, "/completion", body)
        if stream:
            *pieces, final = events(r)
            content = "".join(p["content"] for p in pieces)
        else:
            final = r.json()
            content = final["content"]
        assert content == kept and final["stop_type"] == "limit", (content, kept)
        assert final["tokens_predicted"] < 40


def test_t_max_predict_ms_ends_at_the_first_new_line_past_the_limit(server):
    got = complete(server, prompt=CODE, n_predict=40, t_max_predict_ms=1)
    assert got["stop_type"] == "limit" and got["content"].endswith("\n") and got["content"].count("\n") == 1
    assert got["tokens_predicted"] < 40


def test_n_probs_reports_each_tokens_logprob_and_alternatives(server):
    openai_text(server, PROMPT, 4)
    expected = openai_text(server, PROMPT, 4, logprobs=2)["choices"][0]["logprobs"]
    got = complete(server, prompt=PROMPT, n_predict=4, n_probs=2)
    probs = got["completion_probabilities"]
    assert [p["token"] for p in probs] == expected["tokens"]
    assert [p["logprob"] for p in probs] == pytest.approx(expected["token_logprobs"], abs=1e-4)
    assert all(len(p["top_logprobs"]) == 2 and p["top_logprobs"][0]["logprob"] >= p["logprob"] - 1e-6
               and bytes(p["bytes"]).decode() == p["token"] for p in probs)


def test_llama_cpps_other_samplers_run_in_its_order(server):
    """XTC drops the top choices (the token drawn is never the favourite while another is above
    the threshold); a tiny typical_p or top_n_sigma leaves one token, whatever the seed."""
    for seed in range(4):
        got = complete(server, prompt=PROMPT, n_predict=1, temperature=1.0, seed=seed, n_probs=3,
                       xtc_probability=1.0, xtc_threshold=0.01)
        (first,) = got["completion_probabilities"]
        favourite, second = first["top_logprobs"][:2]
        if math.exp(second["logprob"]) >= 0.01:
            assert first["id"] != favourite["id"], first
        assert got["generation_settings"]["xtc_probability"] == 1.0
    greedy = complete(server, prompt=PROMPT, n_predict=3)["content"]
    for field, value in (("top_n_sigma", 0.01), ("typical_p", 0.01)):
        answers = {complete(server, prompt=PROMPT, n_predict=3, temperature=1.5, seed=seed,
                            **{field: value})["content"] for seed in range(4)}
        assert len(answers) == 1, (field, answers)
        if field == "top_n_sigma":  # within 0.01 deviations of the best logit: the best alone
            assert answers == {greedy}
    chained = post(server, "/completion", {"prompt": PROMPT, "n_predict": 1, "typical_p": 0.5,
                                           "samplers": ["temperature", "typ_p", "top_p"]})
    assert chained.status_code == 400 and chained.json()["error"]["param"] == "typical_p", chained.text


def test_dry_keeps_a_repetition_from_going_on(server):
    """The greedy answer goes on repeating the prompt's phrase; DRY's penalty on the token that
    would extend the repetition turns it aside, and without ``dry`` in the chain it does not."""
    looping = "red green blue red green blue red green blue red green"
    plain = complete(server, prompt=looping, n_predict=1, return_tokens=True)
    dried = complete(server, prompt=looping, n_predict=1, return_tokens=True, dry_multiplier=4.0,
                     dry_allowed_length=2)
    assert plain["content"] == " blue" and dried["tokens"] != plain["tokens"]
    assert dried["generation_settings"]["dry_multiplier"] == 4.0
    assert "dry" in dried["generation_settings"]["samplers"]
    unchained = complete(server, prompt=looping, n_predict=1, return_tokens=True, dry_multiplier=4.0,
                         samplers=["top_k", "temperature"])
    assert unchained["tokens"] == plain["tokens"]


def test_mirostat_replaces_the_chain(server):
    """Mirostat 2 with a tiny target surprise keeps the favourite alone, whatever the seed and the
    chain's filters; generation_settings says it ran in the chain's place."""
    greedy = complete(server, prompt=PROMPT, n_predict=3)["content"]
    for seed in range(3):
        got = complete(server, prompt=PROMPT, n_predict=3, temperature=1.5, seed=seed, top_k=40,
                       mirostat=2, mirostat_tau=0.05, mirostat_eta=0.1)
        assert got["content"] == greedy
    settings = got["generation_settings"]
    assert settings["mirostat"] == 2 and settings["mirostat_tau"] == 0.05
    assert settings["samplers"] == ["penalties", "temperature", "mirostat_v2"]
    wide = {complete(server, prompt=PROMPT, n_predict=3, temperature=1.5, seed=seed, mirostat=2,
                     mirostat_tau=12.0)["content"] for seed in range(6)}
    assert len(wide) > 1  # a high target lets the draw roam


def test_grammars_bias_and_chains_steer_the_one_sampler(server):
    said = complete(server, prompt="Is the sky blue? Answer:", n_predict=8, grammar='root ::= " yes" | " no"')
    assert said["content"] in (" yes", " no")
    as_json = complete(server, prompt="A person as JSON:", n_predict=48,
                       json_schema={"type": "object", "properties": {"age": {"type": "integer"}},
                                    "required": ["age"], "additionalProperties": False})
    assert isinstance(json.loads(as_json["content"])["age"], int)
    first = complete(server, prompt=PROMPT, n_predict=1, return_tokens=True)["tokens"][0]
    banned = complete(server, prompt=PROMPT, n_predict=1, return_tokens=True, logit_bias=[[first, False]])
    assert banned["tokens"][0] != first
    unchained = complete(server, prompt=PROMPT, n_predict=1, samplers=["top-k", "dry"], top_k=1,
                         temperature=0.5)
    assert unchained["generation_settings"]["temperature"] == 1.0  # left out of the chain: off
    assert unchained["generation_settings"]["top_k"] == 1


def test_penalties_count_the_last_repeat_last_n_tokens_as_llama_server_does(server):
    """llama.cpp's penalties see the last ``repeat_last_n`` tokens of the prompt and the answer
    (64 when left out): a window of 0 turns them off, so the answer is the unpenalised one, and
    a window over the whole repetitive prompt changes it."""
    counting = "one two three four five six seven eight nine ten one two three four five six seven"
    complete(server, prompt=counting, n_predict=1)  # warm the prefix: every answer below reads it cached
    plain = complete(server, prompt=counting, n_predict=8)
    body = {"prompt": counting, "n_predict": 8, "repeat_penalty": 1.8, "frequency_penalty": 0.5}
    off = complete(server, **body, repeat_last_n=0)
    whole = complete(server, **body, repeat_last_n=-1)
    default = complete(server, **body)
    assert off["content"] == plain["content"] and whole["content"] != plain["content"]
    assert default["content"] == complete(server, **body, repeat_last_n=64)["content"]
    assert default["generation_settings"]["repeat_last_n"] == 64
    assert whole["generation_settings"]["repeat_last_n"] == -1


def test_response_fields_keeps_only_those_paths(server):
    got = complete(server, prompt=PROMPT, n_predict=2,
                   response_fields=["content", "timings/predicted_n", "no/such/field"])
    assert set(got) == {"content", "timings/predicted_n"} and got["timings/predicted_n"] == 2


@pytest.mark.parametrize("body, param", [
    ({"repeat_penalty": 1.1, "repeat_last_n": -2}, "repeat_last_n"),
    ({"mirostat": 3}, "mirostat"),
    ({"samplers": ["top_k", "dry_run"]}, "samplers"),
    ({"samplers": "kpz"}, "samplers"),
    ({"grammar": "root ::= ("}, "grammar"),
    ({"json_schema": {"type": "frob"}}, "json_schema"),
    ({"n_predict": 100000}, "n_predict"),
    ({"prompt": [10**9]}, "prompt"),
    ({"logit_bias": [[1, True]]}, "logit_bias[0]"),
    ({"n_cmpl": 1000}, "n_cmpl"),
])
def test_what_cannot_be_done_is_a_400_naming_the_field(server, body, param):
    r = post(server, "/completion", {"prompt": PROMPT, **body})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_infill_on_a_model_without_the_tokens_is_a_400_naming_the_suffix(server):
    r = post(server, "/infill", {"input_prefix": "def f(x):\n    ", "input_suffix": "\n    return y\n"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input_suffix", r.text
    assert "no fill-in-the-middle tokens" in r.json()["error"]["message"]


@pytest.mark.parametrize("text, cut", [
    ("a\n    b\n    c", None),  # every line after the first is in
    ("a\n    b\nc", 8),  # "c" is out: cut before it
    ("a\n\t\t\t\tb\n  \n", None),  # tabs count one each; a blank line is not checked
    ("if x:\n  y", 8),
    ("no new line yet", None),
])
def test_the_first_line_indented_less_is_found_after_its_indentation(text, cut):
    from ruvllm.server.llama_server.llama_server_api import _under_indented
    assert _under_indented(text, 4) == cut


def test_a_prompt_from_apply_template_completes_as_chat_answers(server):
    """llama-server's way to edit a chat prompt by hand: render it, then complete the text."""
    messages = [{"role": "user", "content": "Name a colour."}]
    rendered = post(server, "/apply-template", {"messages": messages})
    assert rendered.status_code == 200, rendered.text
    prompt = rendered.json()["prompt"]
    chat = {"messages": messages, "max_tokens": 8, "temperature": 0}
    post(server, "/v1/chat/completions", chat)  # warm: both answers below reuse the prompt's cached KV
    expected = post(server, "/v1/chat/completions", chat).json()
    got = complete(server, prompt=prompt, n_predict=8)
    assert got["content"] == expected["choices"][0]["message"]["content"]
    assert got["tokens_evaluated"] == expected["usage"]["prompt_tokens"]


def test_tokenize_and_detokenize_speak_llama_servers_fields(server):
    text = "Hi <|im_end|> wörld"
    pieces = post(server, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert "".join(t["piece"] for t in pieces) == text  # each piece whole characters here
    assert {"id": 2, "piece": "<|im_end|>"} in pieces  # special tokens written as text are parsed
    plain = post(server, "/tokenize", {"content": text, "parse_special": False}).json()["tokens"]
    assert 2 not in plain and len(plain) > len(pieces)
    as_prompt = post(server, "/tokenize", {"prompt": "Hi"}).json()["tokens"]  # vLLM's: the BOS where wanted
    assert post(server, "/tokenize", {"content": "Hi", "add_special": True}).json()["tokens"] == as_prompt
    ids = [t["id"] for t in pieces]
    assert post(server, "/detokenize", {"tokens": ids}).json() == {"prompt": text, "content": text}
    for body, param in (({"prompt": "Hi", "content": "Hi"}, "content"),
                        ({"prompt": "Hi", "add_special": True}, "add_special"),
                        ({"content": "Hi", "add_special_tokens": False}, "add_special_tokens")):
        r = post(server, "/tokenize", body)
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_llama_vims_chain_runs_the_infill_sampler(server):
    """llama.vim's sampling: top-k and top-p, then llama.cpp's infill rule, at temperature 1. After
    a finished answer SmolLM2 gives its end token about half the mass: the rule ends every answer
    there, where plain sampling from the same candidates writes on about half the time."""
    said = "<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\nHello! How can I help you today?"
    body = {"prompt": said, "n_predict": 6, "top_k": 40, "top_p": 0.9}
    ruled = [complete(server, **body, samplers=["top_k", "top_p", "infill"] if s % 2 else "kpi", seed=s)
             for s in range(8)]  # a chain of names, or of llama.cpp's letters
    plain = [complete(server, **body, samplers=["top_k", "top_p"], seed=s) for s in range(8)]
    assert all(a["stop_type"] == "eos" and a["content"] == "" for a in ruled), ruled
    assert any(a["content"] for a in plain), plain


def test_the_temperature_runs_where_the_chain_puts_it(server):
    """llama.cpp's default chain filters with top-p on the model's own probabilities and applies
    the temperature last; a chain with the temperature first filters the flattened ones. With
    top-p just under the best token's own probability, the first keeps that token alone at any
    temperature, the second keeps several at temperature 2."""
    prompt = "One, two, three, four,"
    (first,) = complete(server, prompt=prompt, n_predict=1, n_probs=1)["completion_probabilities"]
    best = np.exp(first["logprob"])
    assert 0.3 < best < 0.98, best  # a clear favourite that still leaves mass to others
    body = {"prompt": prompt, "n_predict": 1, "temperature": 2.0, "top_p": 0.95 * best, "top_k": 0,
            "min_p": 0.0}
    last = {complete(server, **body, seed=s)["content"] for s in range(12)}
    assert last == {first["token"]}, last
    first_chain = ["penalties", "temperature", "top_k", "top_p", "min_p"]
    early = {complete(server, **body, samplers=first_chain, seed=s)["content"] for s in range(12)}
    assert len(early) > 1, early
    # What ran, in the order it ran, as generation_settings and /props report it.
    ran = complete(server, **body)["generation_settings"]["samplers"]
    assert ran == ["penalties", "top_k", "top_p", "min_p", "temperature"]
    props = httpx.get(server.url + "/props", headers=AUTH).json()
    assert props["default_generation_settings"]["params"]["samplers"] == ran
    ran = complete(server, **body, samplers=first_chain)["generation_settings"]["samplers"]
    assert ran == ["penalties", "temperature", "top_k", "min_p", "top_p"]
    r = post(server, "/completion", {**body, "samplers": ["top_p", "temperature", "min_p"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "samplers", r.text


def test_a_bad_token_id_is_named_by_its_place(server):
    """pydantic's names for a union's branches (``constrained-int``) are not part of the field."""
    for prompt, param in (([[-5]], "prompt[0][0]"), ([["x", 3.5]], "prompt[0][1]")):
        r = post(server, "/completion", {"prompt": prompt, "n_predict": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_a_client_that_leaves_a_whole_answer_cancels_it(server):
    """/completion without stream watches its client as every surface does (Submission.unless_gone):
    one that gives up is answered nothing, and its request is cancelled, not run to the end."""
    from test_serving_behaviour import scrape

    def cancelled() -> float:
        series = ("ruvllm:request_success_total", (("finished_reason", "cancelled"),))
        return scrape(server.url).get(series, 0.0)

    before = cancelled()
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(server.url + "/completion", headers=AUTH, timeout=1.0,
                   json={"prompt": PROMPT, "n_predict": 512, "ignore_eos": True})
    deadline = time.monotonic() + 30
    while cancelled() < before + 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cancelled() == before + 1
