"""The streaming hot path: pre-serialised chunks, batched writes, and the benchmark's SSE reader.

Chunks that are ready together leave the server in one write, and the token chunks are spliced
into a pre-serialised envelope; neither may change what an OpenAI client sees: one chunk per
token, the same bytes as the plain JSON encoding, exact usage.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from ruvllm.bench.serving import sse_data
from ruvllm.server.http.sse import sse_event
from ruvllm.server.openai.formatters import ChatFormatter, CompletionFormatter
from ruvllm.testing.isolation import MARGIN_BOUND
from ruvllm.types import TokenOutput
from server_helpers import API_KEY

TEXTS = ["Hello", " world", "\n", 'say "hi"', "back\\slash", "\t", "\x00\x1f", "é", "日本", "🙂", "</s>",
         "\u2028"]


@pytest.mark.parametrize("formatter", [ChatFormatter, CompletionFormatter])
def test_spliced_token_events_equal_plain_json(formatter):
    fmt = formatter("id-1", "model-x", tokenizer=None, logprobs=None)
    for index in (0, 3):
        for i, text in enumerate(TEXTS):
            out = TokenOutput(index=i, token_id=i, text=text)
            event = fmt.token_event(index, out)
            assert event == sse_event(fmt.token(index, out))
            assert json.loads(event[len("data: "):])["choices"][0]["index"] == index
    # A token that decodes to no text yet (half a UTF-8 character) sends nothing, as before.
    assert fmt.token_event(0, TokenOutput(index=0, token_id=5, text="")) is None


def test_sse_reader_splits_lines_across_reads_with_lf_or_crlf():
    body = b'data: {"a":1}\r\n\r\n: comment\n\ndata: {"b":"x\\ny"}\n\ndata: [DONE]\n\n'

    async def pieces(cut: int):
        yield body[:cut]
        yield body[cut:]

    async def read(cut: int) -> list[bytes]:
        return [p async for p in sse_data(pieces(cut))]

    for cut in range(len(body) + 1):
        assert asyncio.run(read(cut)) == [b'{"a":1}', b'{"b":"x\\ny"}', b"[DONE]"], cut


MESSAGES = [{"role": "user", "content": "Name three colours."}]


def _vocab_ids(tokenizer) -> dict[str, list[int]]:
    """Token display text (what logprobs entries carry) -> the ids that display so."""
    ids: dict[str, list[int]] = {}
    for i in range(tokenizer.vocab_size):
        ids.setdefault(tokenizer.token_text(i), []).append(i)
    return ids


def test_several_streamed_choices_give_one_chunk_per_token_and_exact_usage(client, model_name, server):
    """n=3 streams are interleaved and batched per write; each token is still its own chunk, under
    its own choice's index, in order: every choice's chunks reassemble to a text that its own
    context gives, position by position, before and after the choices differ.

    Greedy choices of one prompt are the same text unless the numerics differ between the rows
    (llama.cpp's AVX2 kernels: the prompt's KV computed once and shared, decode rows batched) and
    a near-tie flips. So each choice's streamed tokens are rescored in one prefill of that
    choice's whole text (/v1/completions with echo and logprobs: the chat prompt's ids plus the
    choice's), and at every position the streamed token must be the rescored best token or
    within ``MARGIN_BOUND`` of it (the conformance suite's near-tie rule), with the rescored
    log-probability within MARGIN_BOUND of the streamed one. A chunk of one choice put under
    another's index after their texts differ continues the other text, far from any tie; a lost,
    duplicated or reordered chunk breaks the count or every position after it. At the first
    difference between the choices, every choice's token must be one of the two near-tied best
    tokens of that position, as their own streamed top_logprobs say."""
    n, max_tokens = 3, 12
    stream = client.chat.completions.create(
        model=model_name, messages=MESSAGES, n=n, max_tokens=max_tokens, temperature=0, logprobs=True,
        top_logprobs=2, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
    per_choice: dict[int, list] = {i: [] for i in range(n)}
    texts: dict[int, str] = dict.fromkeys(range(n), "")
    finish: dict[int, str] = {}
    usage = None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            assert c.index in per_choice, c.index
            assert c.index not in finish, f"a chunk for choice {c.index} after its finish"
            if c.logprobs is not None and c.logprobs.content:
                assert len(c.logprobs.content) == 1  # never two tokens in one chunk
                per_choice[c.index].append(c.logprobs.content[0])
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    assert finish == {i: "length" for i in range(n)}
    assert all(len(tokens) == max_tokens for tokens in per_choice.values()), per_choice
    assert usage is not None and usage.completion_tokens == n * max_tokens

    auth = {"Authorization": f"Bearer {API_KEY}"}
    prompt_ids = httpx.post(f"{server.url}/tokenize", json={"model": model_name, "messages": MESSAGES},
                            headers=auth, timeout=60).json()["tokens"]
    tokenizer = server.engine.tokenizer
    vocab = _vocab_ids(tokenizer)
    at = len(prompt_ids)
    for i, entries in per_choice.items():
        candidates = [vocab.get(e.token, []) for e in entries]
        assert all(len(c) == 1 for c in candidates), (i, [e.token for e in entries], candidates)
        ids = [c[0] for c in candidates]
        # The chunks' texts are their tokens' texts: the choice's text, exactly.
        assert texts[i] == tokenizer.decode(ids), (i, texts[i], [e.token for e in entries])
        scored = client.completions.create(model=model_name, prompt=prompt_ids + ids, echo=True, logprobs=2,
                                           max_tokens=1, temperature=0).choices[0].logprobs
        assert scored.tokens[at:at + max_tokens] == [e.token for e in entries]
        off = []
        for k, e in enumerate(entries):
            top, own = scored.top_logprobs[at + k], scored.token_logprobs[at + k]
            if max(top.values()) - own >= MARGIN_BOUND or abs(own - e.logprob) >= MARGIN_BOUND:
                off.append((k, e.token, round(e.logprob, 3), round(own, 3), top))
        assert not off, (f"choice {i} ({texts[i]!r}) has streamed tokens that its own text does not "
                         f"give (position, token, streamed logprob, rescored, rescored top 2): {off}")

    rows = list(per_choice.values())
    first = next((k for k in range(max_tokens) if len({r[k].token for r in rows}) > 1), None)
    if first is None:
        return  # identical text: the usual case (and always with batch-invariant kernels)
    chosen = {r[first].token for r in rows}
    for r in rows:
        top = sorted(r[first].top_logprobs, key=lambda t: -t.logprob)
        assert chosen <= {t.token for t in top[:2]}, (first, chosen, top)
        assert top[0].logprob - top[1].logprob < MARGIN_BOUND, (first, top)


def test_streamed_completion_text_and_chunk_count_match_usage(client, model_name):
    prompt, max_tokens = "The capital of France is", 16
    ref = client.completions.create(model=model_name, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                    extra_body={"ignore_eos": True})
    chunks = list(client.completions.create(model=model_name, prompt=prompt, max_tokens=max_tokens,
                                            temperature=0, stream=True, extra_body={"ignore_eos": True},
                                            stream_options={"include_usage": True}))
    text_chunks = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
    assert "".join(text_chunks) == ref.choices[0].text
    assert chunks[-1].usage.completion_tokens == ref.usage.completion_tokens == max_tokens
    # One chunk per token whose text is complete; a token ending mid-character waits for the next.
    assert len(text_chunks) <= max_tokens
    assert len(text_chunks) >= max_tokens - sum(1 for t in text_chunks if not t.isascii())
