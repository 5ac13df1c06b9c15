"""Anthropic's Message Batches API through the official ``anthropic`` client, on the real engine.

What a client relies on: a batch ends with one result per request in request order (the message
``/v1/messages`` gives, or the error it gives), counts that add up, a cancel that ends it with
the unanswered requests ``canceled`` and the engine freed, Anthropic's rules on when results
and deletion are allowed, and pages of the batch list.
"""

from __future__ import annotations

import time

import anthropic
import httpx
import pytest
from server_helpers import API_KEY


@pytest.fixture(scope="module")
def claude(server):
    return anthropic.Anthropic(base_url=server.url, api_key=API_KEY, max_retries=0, timeout=60)


def params(content: str, max_tokens: int = 8, **extra) -> dict:
    return {"model": "default", "max_tokens": max_tokens, "temperature": 0,
            "messages": [{"role": "user", "content": content}], **extra}


def wait_ended(claude, batch_id: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    batch = claude.messages.batches.retrieve(batch_id)
    while batch.processing_status != "ended" and time.monotonic() < deadline:
        time.sleep(0.05)
        batch = claude.messages.batches.retrieve(batch_id)
    return batch


def test_a_batch_ends_with_each_requests_result_in_order(claude):
    requests = [{"custom_id": f"q{i}", "params": params(f"Count to {i}.")} for i in range(3)]
    requests.insert(1, {"custom_id": "refused", "params": params("x", max_tokens=-1)})
    requests.append({"custom_id": "streamed", "params": params("x", stream=True)})
    batch = claude.messages.batches.create(requests=requests)
    assert batch.processing_status == "in_progress" and batch.results_url is None
    assert batch.request_counts.processing == 5
    batch = wait_ended(claude, batch.id)
    assert batch.processing_status == "ended" and batch.ended_at is not None
    counts = batch.request_counts
    assert (counts.processing, counts.succeeded, counts.errored, counts.canceled) == (0, 3, 2, 0)
    results = list(claude.messages.batches.results(batch.id))
    assert [r.custom_id for r in results] == ["q0", "refused", "q1", "q2", "streamed"]
    assert [r.result.type for r in results] == ["succeeded", "errored", "succeeded", "succeeded", "errored"]
    assert all(r.result.message.content[0].text for r in results if r.result.type == "succeeded")
    assert results[1].result.error.error.type == "invalid_request_error"
    assert results[1].result.error.error.message.startswith("max_tokens")
    assert results[4].result.error.error.message.startswith("stream")


def test_a_request_in_a_batch_answers_what_messages_answers(claude):
    body = params("Name a colour.", max_tokens=16)
    # This SDK's create() has no temperature argument: the body takes it as the API does.
    direct = {k: v for k, v in body.items() if k != "temperature"}
    claude.messages.create(**{**direct, "max_tokens": 1}, extra_body={"temperature": 0})  # warm the prefix
    alone = claude.messages.create(**direct, extra_body={"temperature": 0})
    batch = claude.messages.batches.create(requests=[{"custom_id": "one", "params": body}])
    wait_ended(claude, batch.id)
    (result,) = claude.messages.batches.results(batch.id)
    message = result.result.message
    assert message.content[0].text == alone.content[0].text
    assert message.usage.output_tokens == alone.usage.output_tokens


def test_cancelling_ends_the_batch_and_frees_the_engine(claude, server):
    requests = [{"custom_id": f"s{i}", "params": params("Tell a long story.", max_tokens=300)}
                for i in range(10)]
    batch = claude.messages.batches.create(requests=requests)
    deadline = time.monotonic() + 30
    while server.engine.metrics().running == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    cancelling = claude.messages.batches.cancel(batch.id)
    assert cancelling.processing_status in ("canceling", "ended") and cancelling.cancel_initiated_at
    batch = wait_ended(claude, batch.id)
    counts = batch.request_counts
    assert counts.canceled > 0 and counts.succeeded + counts.errored + counts.canceled == 10
    results = list(claude.messages.batches.results(batch.id))
    assert sum(r.result.type == "canceled" for r in results) == counts.canceled
    deadline = time.monotonic() + 10
    while server.engine.metrics().running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.engine.metrics().running == 0


def test_results_and_deletion_wait_for_the_end(claude, server):
    batch = claude.messages.batches.create(
        requests=[{"custom_id": "slow", "params": params("Tell a long story.", max_tokens=200)}])
    headers = {"x-api-key": API_KEY, "authorization": f"Bearer {API_KEY}"}
    early = httpx.get(f"{server.url}/v1/messages/batches/{batch.id}/results", headers=headers)
    assert early.status_code == 400 and "has ended" in early.json()["error"]["message"]
    with pytest.raises(anthropic.BadRequestError, match="it can be deleted once it has ended"):
        claude.messages.batches.delete(batch.id)
    claude.messages.batches.cancel(batch.id)
    wait_ended(claude, batch.id)
    assert claude.messages.batches.delete(batch.id).type == "message_batch_deleted"
    with pytest.raises(anthropic.NotFoundError, match="no message batch"):
        claude.messages.batches.retrieve(batch.id)


def test_the_list_pages_newest_first(claude):
    made = [claude.messages.batches.create(requests=[{"custom_id": "a", "params": params("Hi", 1)}]).id
            for _ in range(3)]
    newest = claude.messages.batches.list(limit=2)
    assert [b.id for b in newest.data] == made[::-1][:2] and newest.has_more
    older = claude.messages.batches.list(limit=2, after_id=newest.last_id)
    assert older.data[0].id == made[0]
    back = claude.messages.batches.list(limit=1, before_id=made[0])
    assert back.data[0].id == made[1]


def test_malformed_batches_are_refused_by_name(claude, server):
    twice = [{"custom_id": "a", "params": {}}, {"custom_id": "a", "params": {}}]
    with pytest.raises(anthropic.BadRequestError, match=r"requests\[1\]\.custom_id: 'a' is also"):
        claude.messages.batches.create(requests=twice)
    with pytest.raises(anthropic.BadRequestError, match=r"requests\[0\]\.custom_id"):
        claude.messages.batches.create(requests=[{"custom_id": "not an id!", "params": {}}])
    with pytest.raises(anthropic.BadRequestError, match="requests"):
        claude.messages.batches.create(requests=[])
    r = httpx.get(f"{server.url}/v1/messages/batches", params={"page": 2},
                  headers={"authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("page")


def test_a_batch_larger_than_a_request_body_is_taken(claude):
    """The session server limits bodies to 64 KiB: the batch's body (max_file_bytes) may be larger,
    each request in it is held to the limit it would meet alone."""
    half = "word " * 7_000  # 35 KB each, 70 KB together
    requests = [{"custom_id": f"r{i}", "params": params(half, max_tokens=100_000)} for i in range(2)]
    requests.append({"custom_id": "over", "params": params(half * 2)})
    batch = claude.messages.batches.create(requests=requests)
    assert wait_ended(claude, batch.id).request_counts.errored == 3
    errors = [r.result.error.error for r in claude.messages.batches.results(batch.id)]
    # Checked as /v1/messages checks them: before any prefill, so nothing was computed.
    assert ["max_tokens" in e.message for e in errors] == [True, True, False]
    assert errors[2].type == "request_too_large" and "max_body_bytes" in errors[2].message
