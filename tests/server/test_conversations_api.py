"""OpenAI's Conversations API through the official ``openai`` client, on the real engine.

What a client relies on: a conversation keeps its items (each with an id, as the SDK's own types
read them), a response created with ``conversation`` sees them (it answers as chat does with the
same turns) and adds its input and output to them, items can be added, listed, read and deleted,
and what cannot be kept or run is refused by name.
"""

from __future__ import annotations

import httpx
import openai
import pytest
from openai.types import conversations as conversation_types
from pydantic import TypeAdapter
from server_helpers import API_KEY, start_server

ITEM = TypeAdapter(conversation_types.ConversationItem)


def test_a_response_in_a_conversation_sees_its_items_and_joins_them(client, model_name):
    conversation = client.conversations.create(
        items=[{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."}],
        metadata={"topic": "colours"})
    assert conversation.metadata == {"topic": "colours"}
    body = {"model": model_name, "conversation": conversation.id, "input": "And another one?",
            "max_output_tokens": 12, "temperature": 0}
    # Warm the prefix on a copy (the answer joins the conversation it names).
    warm = client.conversations.create(items=[{"role": "user", "content": "Name a colour."},
                                              {"role": "assistant", "content": "Blue."}])
    client.responses.create(**{**body, "conversation": warm.id, "max_output_tokens": 1})
    response = client.responses.create(**body)
    assert response.conversation.id == conversation.id
    chat = client.chat.completions.create(
        model=model_name, max_tokens=12, temperature=0,
        messages=[{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
                  {"role": "user", "content": "And another one?"}])
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.input_tokens == chat.usage.prompt_tokens

    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"),
                                                 ("message", "user"), ("message", "assistant")]
    assert items[2].content[0].text == "And another one?" and items[3].id == response.output[0].id
    for item in items:
        ITEM.validate_python(item.to_dict())
    newest = client.conversations.items.list(conversation.id, limit=1)
    assert newest.data[0].id == items[3].id and newest.has_more


def test_a_streamed_response_joins_its_conversation_too(client, model_name):
    conversation = client.conversations.create()
    events = list(client.responses.create(model=model_name, conversation={"id": conversation.id},
                                          input="Say hi.", max_output_tokens=4, stream=True))
    final = events[-1].response
    items = client.conversations.items.list(conversation.id, order="asc").data
    assert [i.id for i in items][1:] == [o.id for o in final.output]


def test_items_are_added_read_and_deleted(client):
    conversation = client.conversations.create(items=[{"role": "user", "content": "Hi"}])
    added = client.conversations.items.create(conversation.id, items=[
        {"type": "function_call", "call_id": "call_1", "name": "get_time", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "12:00"}]).data
    assert [a.type for a in added] == ["function_call", "function_call_output"]
    read = client.conversations.items.retrieve(added[0].id, conversation_id=conversation.id)
    assert read.call_id == "call_1"
    client.conversations.items.delete(added[0].id, conversation_id=conversation.id)
    remaining = [i.type for i in client.conversations.items.list(conversation.id, order="asc").data]
    assert remaining == ["message", "function_call_output"]
    with pytest.raises(openai.NotFoundError, match="no item"):
        client.conversations.items.retrieve(added[0].id, conversation_id=conversation.id)
    assert client.conversations.update(conversation.id, metadata={"k": "v"}).metadata == {"k": "v"}
    assert client.conversations.delete(conversation.id).deleted
    with pytest.raises(openai.NotFoundError, match="no conversation"):
        client.conversations.retrieve(conversation.id)


def test_what_cannot_be_kept_or_run_is_refused_by_name(client, model_name, server):
    conversation = client.conversations.create()
    with pytest.raises(openai.BadRequestError) as err:
        client.conversations.items.create(conversation.id, items=[{"type": "web_search_call", "id": "ws_1"}])
    assert err.value.body["param"] == "items[0].type"
    with pytest.raises(openai.BadRequestError) as err:
        client.conversations.create(items=[{"role": "user", "content": [{"type": "input_image",
                                                                          "image_url": "https://x.org/a.png"}]}])
    assert err.value.body["param"] == "items[0].content[0].type"
    # A type that is an object (once a 500, issue 62), on both routes that take items.
    for call in (lambda: client.conversations.create(items=[{"id": "0", "type": {}}]),
                 lambda: client.conversations.items.create(conversation.id, items=[{"id": "0", "type": {}}])):
        with pytest.raises(openai.BadRequestError) as err:
            call()
        assert err.value.body["param"] == "items[0].type" and "must be one of message" in \
            err.value.body["message"], err.value.body
    first = client.responses.create(model=model_name, input="Hi", max_output_tokens=2)
    with pytest.raises(openai.BadRequestError, match="send one of the two"):
        client.responses.create(model=model_name, input="Hi", conversation=conversation.id,
                                previous_response_id=first.id)
    with pytest.raises(openai.NotFoundError, match="no conversation 'conv_gone'"):
        client.responses.create(model=model_name, input="Hi", conversation="conv_gone")
    r = httpx.get(f"{server.base_url}/conversations/{conversation.id}/items", params={"before": "x"},
                  headers={"authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "before"


def test_the_store_keeps_the_newest_conversations():
    server = start_server(server={"stored_conversations": 1})
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
        older, newer = client.conversations.create(), client.conversations.create()
        with pytest.raises(openai.NotFoundError, match="keeps the newest 1 conversations"):
            client.conversations.retrieve(older.id)
        assert client.conversations.retrieve(newer.id).id == newer.id
    finally:
        server.stop()
