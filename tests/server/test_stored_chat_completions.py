"""OpenAI's stored chat completions through the official ``openai`` client, on the real engine:
``store: true`` keeps the answer (whole or streamed) for ``list`` (by model, metadata, order,
page), ``retrieve``, ``update`` (metadata), ``delete`` and ``messages.list``; without ``store``
nothing is kept."""

from __future__ import annotations

import openai
import pytest
from server_helpers import API_KEY, start_server

ASK = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def _greedy(model: str, **body) -> dict:
    return {"model": model, "messages": ASK, "max_tokens": 6, "temperature": 0, **body}


def test_a_stored_completion_is_listed_retrieved_updated_and_deleted(client, model_name):
    whole = client.chat.completions.create(**_greedy(model_name), store=True, metadata={"run": "a"})
    stream = client.chat.completions.create(**_greedy(model_name), store=True, metadata={"run": "b"},
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    streamed_id = chunks[0].id
    unstored = client.chat.completions.create(**_greedy(model_name))

    fetched = client.chat.completions.retrieve(whole.id)
    assert fetched.choices[0].message.content == whole.choices[0].message.content
    assert fetched.usage == whole.usage
    kept_stream = client.chat.completions.retrieve(streamed_id)
    assert kept_stream.choices[0].message.content == "".join(
        c.choices[0].delta.content or "" for c in chunks if c.choices)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(unstored.id)

    ours = {whole.id, streamed_id}
    listed = [c.id for c in client.chat.completions.list(model=model_name) if c.id in ours]
    assert listed == [whole.id, streamed_id]  # oldest first by default
    assert [c.id for c in client.chat.completions.list(metadata={"run": "b"})] == [streamed_id]
    newest = client.chat.completions.list(order="desc", limit=1)
    assert newest.data[0].id == streamed_id and newest.has_more

    messages = client.chat.completions.messages.list(whole.id)
    assert [(m.role, m.content) for m in messages.data] == [(m["role"], m["content"]) for m in ASK]
    assert all(m.id for m in messages.data)

    updated = client.chat.completions.update(whole.id, metadata={"run": "c"})
    assert updated.id == whole.id
    assert [c.id for c in client.chat.completions.list(metadata={"run": "c"})] == [whole.id]
    deleted = client.chat.completions.delete(whole.id)
    assert deleted.deleted and deleted.id == whole.id
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.retrieve(whole.id)


def test_a_server_that_keeps_none_refuses_store_by_name():
    running = start_server(server={"stored_chat_completions": 0})
    try:
        client = openai.OpenAI(base_url=running.base_url, api_key=API_KEY, max_retries=0, timeout=60)
        model = client.models.list().data[0].id
        with pytest.raises(openai.BadRequestError) as refused:
            client.chat.completions.create(**_greedy(model), store=True)
        assert refused.value.body["param"] == "store"
        assert client.chat.completions.create(**_greedy(model), store=False).choices
    finally:
        running.stop()
