"""Stored responses of the Responses API through the official ``openai`` client, on the real engine.

What a client relies on: ``previous_response_id`` continues the stored conversation (the model
sees the earlier turns and answers as chat does with them), ``GET`` returns what ``create``
returned, ``input_items`` lists what the model was given, ``store: false`` keeps nothing,
``background: true`` runs to a result a client polls (or cancels, freeing the engine), and the
store keeps the newest ``stored_responses``, saying so when one is gone.

Answers compared with each other run warm (see test_responses_api.py: a cached prefix's kernels
round differently from a cold prompt's).
"""

from __future__ import annotations

import time

import openai
import pytest
from server_helpers import API_KEY, start_server

FIRST = "Name a colour."
SECOND = "And another one?"


def _greedy(model: str, **body) -> dict:
    return {"model": model, "max_output_tokens": 12, "temperature": 0, **body}


def _wait(client, response_id: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    response = client.responses.retrieve(response_id)
    while response.status in ("queued", "in_progress") and time.monotonic() < deadline:
        time.sleep(0.05)
        response = client.responses.retrieve(response_id)
    return response


def test_previous_response_id_continues_the_conversation_as_chat_would(client, model_name):
    first = client.responses.create(**_greedy(model_name, input=FIRST, instructions="Be brief."))
    assert first.store is True
    body = _greedy(model_name, input=SECOND, previous_response_id=first.id)
    client.responses.create(**{**body, "max_output_tokens": 1})  # warm the prefix
    second = client.responses.create(**body)
    assert second.previous_response_id == first.id
    # The earlier turns without their instructions (OpenAI does not carry them over), then this input.
    chat = client.chat.completions.create(
        model=model_name, max_tokens=12, temperature=0,
        messages=[{"role": "user", "content": FIRST}, {"role": "assistant", "content": first.output_text},
                  {"role": "user", "content": SECOND}])
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.output_text == chat.choices[0].message.content

    items = client.responses.input_items.list(second.id, order="asc").data
    assert [(i.type, i.role) for i in items] == [("message", "user"), ("message", "assistant"),
                                                 ("message", "user")]
    assert items[1].id == first.output[0].id and items[2].content[0].text == SECOND
    assert all(i.id for i in items)
    newest = client.responses.input_items.list(second.id, limit=1)
    assert newest.data[0].id == items[2].id and newest.has_more
    rest = client.responses.input_items.list(second.id, after=newest.data[0].id)
    assert [i.id for i in rest.data] == [items[1].id, items[0].id] and not rest.has_more


def test_get_returns_what_create_returned_whole_or_streamed(client, model_name):
    whole = client.responses.create(**_greedy(model_name, input="Say hello."))
    assert client.responses.retrieve(whole.id).to_dict() == whole.to_dict()
    events = list(client.responses.create(**_greedy(model_name, input="Say goodbye."), stream=True))
    streamed = events[-1].response  # response.completed, or response.incomplete at max_output_tokens
    fetched = client.responses.retrieve(streamed.id)
    assert fetched.output_text == streamed.output_text and fetched.status == streamed.status
    assert fetched.usage == streamed.usage


def test_store_false_keeps_nothing(client, model_name):
    response = client.responses.create(**_greedy(model_name, input="Say hello."), store=False)
    assert response.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(response.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.create(**_greedy(model_name, input="Again."), previous_response_id=response.id)


def test_a_refusal_of_a_continued_request_names_the_clients_own_item(client, model_name):
    first = client.responses.create(**_greedy(model_name, input=FIRST))
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**_greedy(model_name, previous_response_id=first.id, input=[
            {"role": "user", "content": "Hi"},
            {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{oops"}]))
    assert err.value.body["param"] == "input[1].arguments", err.value.body


def test_delete_forgets_a_response(client, model_name):
    response = client.responses.create(**_greedy(model_name, input="Say hello."))
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError, match="no response"):
        client.responses.retrieve(response.id)


def test_a_background_response_runs_to_the_answer_a_foreground_one_gives(client, model_name):
    body = _greedy(model_name, input="Count to three.")
    client.responses.create(**{**body, "max_output_tokens": 1})  # warm the prefix
    foreground = client.responses.create(**body)
    started = client.responses.create(**body, background=True)
    assert started.background is True and started.status in ("queued", "in_progress")
    done = _wait(client, started.id)
    assert done.status == foreground.status and done.output_text == foreground.output_text
    assert done.usage.output_tokens == foreground.usage.output_tokens
    with pytest.raises(openai.BadRequestError, match="only a background response can be cancelled"):
        client.responses.cancel(foreground.id)
    assert client.responses.cancel(done.id).status == done.status  # an ended one stays as it ended


@pytest.mark.parametrize(("extra", "param"), [({"stream": True}, "stream"), ({"store": False}, "background")])
def test_what_a_background_response_cannot_be_is_refused(client, model_name, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(**_greedy(model_name, input="Hi"), background=True, **extra)
    assert err.value.body["param"] == param, err.value.body


def test_cancelling_a_background_response_frees_the_engine(client, model_name, server):
    body = _greedy(model_name, input="Tell a long story.", max_output_tokens=400)
    started = client.responses.create(**body, background=True)
    with pytest.raises(openai.BadRequestError, match="still in progress"):
        client.responses.create(**_greedy(model_name, input="Go on."), previous_response_id=started.id)
    cancelled = client.responses.cancel(started.id)
    assert cancelled.status == "cancelled"
    deadline = time.monotonic() + 10
    while server.engine.metrics().running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.engine.metrics().running == 0
    assert client.responses.retrieve(started.id).status == "cancelled"


def test_the_store_keeps_the_newest_and_says_when_one_is_gone():
    server = start_server(server={"stored_responses": 2})
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
        model = server.engine.info.name
        ids = [client.responses.create(**_greedy(model, input=f"Say {n}.", max_output_tokens=2)).id
               for n in ("one", "two", "three")]
        with pytest.raises(openai.NotFoundError, match=r"keeps the newest 2 responses"):
            client.responses.retrieve(ids[0])
        assert [client.responses.retrieve(i).id for i in ids[1:]] == ids[1:]
    finally:
        server.stop()


def test_a_server_that_keeps_no_responses_is_stateless_and_says_so():
    server = start_server(server={"stored_responses": 0})
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
        model = server.engine.info.name
        response = client.responses.create(**_greedy(model, input="Hi", max_output_tokens=2))
        assert response.store is False
        with pytest.raises(openai.NotFoundError, match=r"stored_responses = 0"):
            client.responses.create(**_greedy(model, input="Again"), previous_response_id=response.id)
        with pytest.raises(openai.BadRequestError, match=r"stored_responses > 0"):
            client.responses.create(**_greedy(model, input="Hi"), background=True)
    finally:
        server.stop()


def test_stopping_the_server_ends_a_running_background_response():
    server = start_server()
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0)
        client.responses.create(**_greedy(server.engine.info.name, input="Tell a long story.",
                                          max_output_tokens=400), background=True)
    finally:
        started = time.monotonic()
        server.stop()
    assert not server.thread.is_alive() and time.monotonic() - started < 15


def test_item_references_stand_for_the_stored_items(client, model_name):
    """A turn built from references to a stored response's input and output items is the turn
    with those items sent whole: the same prompt, the same answer; a conversation's items are
    found too, and an unknown id is a 404."""
    first = client.responses.create(**_greedy(model_name, input=FIRST))
    asked = client.responses.input_items.list(first.id).data[0]
    said = first.output[0]
    referenced = [{"type": "item_reference", "id": asked.id}, {"type": "item_reference", "id": said.id},
                  {"role": "user", "content": SECOND}]
    whole = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": first.output_text},
             {"role": "user", "content": SECOND}]
    client.responses.create(**_greedy(model_name, input=whole, max_output_tokens=1))  # warm the prefix
    by_reference = client.responses.create(**_greedy(model_name, input=referenced))
    sent_whole = client.responses.create(**_greedy(model_name, input=whole))
    assert by_reference.usage.input_tokens == sent_whole.usage.input_tokens
    assert by_reference.output_text == sent_whole.output_text
    stored = client.responses.input_items.list(by_reference.id, order="asc").data
    assert [i.id for i in stored[:2]] == [asked.id, said.id]
    assert stored[1].content[0].text == first.output_text

    conversation = client.conversations.create(items=[{"role": "user", "content": "Hi"}])
    kept = client.conversations.items.list(conversation.id).data[0]
    echoed = client.responses.create(**_greedy(model_name, input=[{"type": "item_reference", "id": kept.id}],
                                               store=False))
    alone = client.responses.create(**_greedy(model_name, input="Hi", store=False))
    assert echoed.usage.input_tokens == alone.usage.input_tokens

    with pytest.raises(openai.NotFoundError) as missing:
        client.responses.create(**_greedy(model_name, input=[{"type": "item_reference", "id": "msg_none"}]))
    assert "msg_none" in str(missing.value)
    # A conversation keeps items, not references.
    with pytest.raises(openai.BadRequestError) as refused:
        client.conversations.create(items=[{"type": "item_reference", "id": kept.id}])
    assert refused.value.body["param"] == "items[0].type"


def test_an_output_items_id_sent_back_changes_nothing(client, model_name):
    """The id (and status) of an earlier answer sent back as an input item is accepted and
    looked up nowhere: the answer is the one without them."""
    def answered(**extra) -> list[dict]:
        said = {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Red."}],
                **extra}
        return [{"role": "user", "content": FIRST}, said, {"role": "user", "content": SECOND}]

    plain = client.responses.create(**_greedy(model_name, input=answered(), store=False))
    with_id = client.responses.create(**_greedy(model_name, input=answered(id="msg_0123", status="completed"),
                                                store=False))
    assert with_id.output_text == plain.output_text
    assert with_id.usage.input_tokens == plain.usage.input_tokens  # the cached part may differ
