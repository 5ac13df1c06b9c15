"""OpenAI's Batch and Files APIs through the official ``openai`` client, on the real engine.

What a client relies on: a batch runs in the background to ``completed`` with its counts, usage
and two files (answers, refusals) in input order; a malformed input fails the batch with each
line named; cancelling keeps what was answered and frees the engine; a batch leaves interactive
clients their share of the engine; the objects parse as the SDK's own types.
"""

from __future__ import annotations

import io
import json
import tempfile
import threading
import time

import httpx
import openai
import openai.types
import pytest
from ruvllm.errors import StoredObjectNotFound
from ruvllm.server.batches.file_store import FileStore
from server_helpers import API_KEY, start_server


def jsonl(lines: list[dict]) -> io.BytesIO:
    return io.BytesIO("\n".join(json.dumps(x) for x in lines).encode())


def chat_line(custom_id: str, content: str, model: str, **body) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 8,
                     **body}}


def wait_until_done(client: openai.OpenAI, batch_id: str, timeout: float = 120) -> openai.types.Batch:
    deadline = time.monotonic() + timeout
    while True:
        batch = client.batches.retrieve(batch_id)
        if batch.status in ("completed", "failed", "cancelled") or time.monotonic() > deadline:
            return batch
        time.sleep(0.1)


def content_lines(client: openai.OpenAI, file_id: str) -> list[dict]:
    return [json.loads(x) for x in client.files.content(file_id).text.splitlines()]


@pytest.fixture(scope="module")
def running():
    # max_num_seqs 4: batches get 2 running slots, interactive requests the other 2.
    server = start_server(engine_options={"max_num_seqs": 4}, server={"max_file_bytes": 64 * 1024})
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(running) -> openai.OpenAI:
    return openai.OpenAI(base_url=running.base_url, api_key=API_KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def model(running) -> str:
    return running.engine.info.name


def test_a_batch_runs_to_completed_with_its_answers_and_refusals_in_input_order(client, running, model):
    lines = [chat_line(f"q{i}", f"Count to {i}.", model) for i in range(5)]
    lines.insert(2, chat_line("refused", "x", model, max_tokens=-1))
    upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    assert (upload.purpose, upload.status, upload.filename) == ("batch", "processed", "in.jsonl")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h", metadata={"job": "nightly"})
    assert batch.status == "in_progress" and batch.request_counts.total == 6
    batch = wait_until_done(client, batch.id)
    assert batch.status == "completed", batch
    assert (batch.request_counts.completed, batch.request_counts.failed) == (5, 1)
    assert batch.metadata == {"job": "nightly"} and batch.model == model
    assert batch.in_progress_at <= batch.finalizing_at <= batch.completed_at
    answers = content_lines(client, batch.output_file_id)
    assert [a["custom_id"] for a in answers] == [f"q{i}" for i in range(5)]
    bodies = [openai.types.chat.ChatCompletion.model_validate(a["response"]["body"]) for a in answers]
    assert all(b.choices[0].message.content for b in bodies)
    assert batch.usage.input_tokens == sum(b.usage.prompt_tokens for b in bodies)
    assert batch.usage.output_tokens == sum(b.usage.completion_tokens for b in bodies)
    (refusal,) = content_lines(client, batch.error_file_id)
    assert refusal["custom_id"] == "refused" and refusal["response"]["status_code"] == 400
    assert refusal["response"]["body"]["error"]["param"] == "max_tokens"
    # The raw objects are the SDK's types, every required field present.
    raw = httpx.get(f"{running.base_url}/batches/{batch.id}", headers={"authorization": f"Bearer {API_KEY}"})
    openai.types.Batch.model_validate(raw.json())
    assert batch.id in [b.id for b in client.batches.list()]
    kinds = {f.id: f.purpose for f in client.files.list()}
    assert kinds[upload.id] == "batch" and kinds[batch.output_file_id] == "batch_output"


def test_a_malformed_input_fails_the_batch_naming_each_line(client, model):
    lines = (json.dumps(chat_line("a", "Hi", model)) + "\nnot json\n"
             + json.dumps({**chat_line("b", "Hi", model), "url": "/v1/embeddings"}) + "\n"
             + json.dumps(chat_line("a", "Hi", model)))
    upload = client.files.create(file=("bad.jsonl", io.BytesIO(lines.encode())), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    assert batch.status == "failed" and batch.failed_at is not None
    assert [(e.line, e.code) for e in batch.errors.data] == [(2, "invalid_request"), (3, "invalid_request"),
                                                             (4, "invalid_request")]
    messages = [e.message for e in batch.errors.data]
    assert "not JSON" in messages[0] and "one endpoint per batch" in messages[1]
    assert "repeats custom_id 'a'" in messages[2]
    assert batch.request_counts.total == 0 and batch.output_file_id is None


def test_cancelling_keeps_what_was_answered_and_frees_the_engine(client, running, model):
    lines = [chat_line(f"q{i}", "Tell a long story.", model, max_tokens=200, ignore_eos=True)
             for i in range(12)]
    upload = client.files.create(file=("long.jsonl", jsonl(lines)), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    deadline = time.monotonic() + 60
    while running.engine.metrics().running == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status in ("cancelling", "cancelled")
    batch = wait_until_done(client, batch.id)
    assert batch.status == "cancelled" and batch.cancelling_at is not None and batch.cancelled_at is not None
    counts = batch.request_counts
    assert counts.completed + counts.failed < counts.total == 12
    if counts.completed:
        assert len(content_lines(client, batch.output_file_id)) == counts.completed
    deadline = time.monotonic() + 10
    while running.engine.metrics().running + running.engine.metrics().waiting and time.monotonic() < deadline:
        time.sleep(0.05)
    metrics = running.engine.metrics()
    assert (metrics.running, metrics.waiting) == (0, 0)
    # Cancelling an ended batch changes nothing.
    assert client.batches.cancel(batch.id).status == "cancelled"


def test_a_batch_leaves_interactive_clients_their_share_of_the_engine(client, running, model):
    lines = [chat_line(f"q{i}", f"Story number {i}.", model, max_tokens=48, ignore_eos=True)
             for i in range(8)]
    upload = client.files.create(file=("share.jsonl", jsonl(lines)), purpose="batch")
    peak = 0
    stop = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, running.engine.metrics().running)
            time.sleep(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                      completion_window="24h")
        batch = wait_until_done(client, batch.id)
    finally:
        stop.set()
        watcher.join()
    assert batch.status == "completed" and batch.request_counts.completed == 8
    assert peak == 2  # half of max_num_seqs 4: the batch fills its share and no more

    # While a batch runs, an interactive request is served beside it.
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                                  completion_window="24h")
    answer = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=4)
    assert answer.choices[0].message.content
    assert client.batches.retrieve(batch.id).status == "in_progress"
    assert wait_until_done(client, batch.id).status == "completed"


def test_files_round_trip_list_and_delete(client, running):
    data = b'{"custom_id": "x", "method": "POST", "url": "/v1/embeddings", "body": {"input": "hi"}}\n'
    first = client.files.create(file=("a.jsonl", io.BytesIO(data)), purpose="batch")
    second = client.files.create(file=("b.jsonl", io.BytesIO(data)), purpose="batch")
    assert client.files.content(first.id).content == data and first.bytes == len(data)
    newest = [f.id for f in client.files.list(purpose="batch")]
    assert newest.index(second.id) < newest.index(first.id)
    oldest = [f.id for f in client.files.list(purpose="batch", order="asc")]
    assert oldest.index(first.id) < oldest.index(second.id)
    page = client.files.list(purpose="batch", order="asc", limit=1, after=first.id)
    assert page.data[0].id == oldest[oldest.index(first.id) + 1]
    assert client.files.delete(first.id).deleted
    with pytest.raises(openai.NotFoundError, match="no file"):
        client.files.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.batches.create(input_file_id=first.id, endpoint="/v1/embeddings", completion_window="24h")


def test_bad_uploads_and_batch_requests_are_refused_by_name(client, running):
    with pytest.raises(openai.BadRequestError, match="purpose: 'fine-tune' is for a feature"):
        client.files.create(file=("x.jsonl", io.BytesIO(b"{}")), purpose="fine-tune")
    with pytest.raises(openai.APIStatusError, match="max_file_bytes") as err:
        client.files.create(file=("big.jsonl", io.BytesIO(b"x" * (65 * 1024))), purpose="batch")
    assert err.value.status_code == 413
    headers = {"authorization": f"Bearer {API_KEY}"}
    r = httpx.post(f"{running.base_url}/files", headers=headers, data={"purpose": "batch", "colour": "red"},
                   files={"file": ("x.jsonl", b"{}")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "colour"
    r = httpx.post(f"{running.base_url}/files", headers=headers, files={"file": ("x.jsonl", b"{}")})
    assert r.status_code == 400 and r.json()["error"]["param"] == "purpose"
    upload = client.files.create(file=("ok.jsonl", io.BytesIO(b"{}")), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="endpoint: '/v1/moderations' is not served"):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/moderations", completion_window="24h")
    with pytest.raises(openai.BadRequestError, match="completion_window"):
        client.batches.create(input_file_id=upload.id, endpoint="/v1/embeddings", completion_window="1h")
    with pytest.raises(openai.NotFoundError, match="no batch 'batch_gone'"):
        client.batches.retrieve("batch_gone")
    r = httpx.get(f"{running.base_url}/batches", headers=headers, params={"after": "batch_gone"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "after"


def test_a_file_expires_when_its_expires_after_says():
    now = [1000.0]
    store = FileStore(clock=lambda: now[0])
    try:
        kept = store.upload(io.BytesIO(b"a"), filename="a", purpose="batch")
        brief = store.upload(io.BytesIO(b"b"), filename="b", purpose="batch", expires_after=3600)
        assert brief.card()["expires_at"] == 4600
        now[0] = 4599
        assert [f.id for f in store.listing()] == [brief.id, kept.id]
        now[0] = 4600
        assert [f.id for f in store.listing()] == [kept.id]
        assert not brief.path.exists()
        with pytest.raises(StoredObjectNotFound):
            store.get(brief.id)
    finally:
        store.close()


def test_the_files_directory_is_made_by_the_first_file_and_removed_on_close(tmp_path, monkeypatch):
    """A server that never stores a file (or is killed before its shutdown) leaves nothing in /tmp."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    store = FileStore()
    assert list(tmp_path.iterdir()) == []
    stored = store.upload(io.BytesIO(b"a"), filename="a", purpose="batch")
    assert stored.path.parent.parent == tmp_path and stored.path.read_bytes() == b"a"
    store.close()
    assert list(tmp_path.iterdir()) == []
    FileStore().close()
    assert list(tmp_path.iterdir()) == []


def test_stopping_the_server_while_a_batch_runs_ends_it_cleanly(model):
    server = start_server(engine_options={"max_num_seqs": 2})
    try:
        client = openai.OpenAI(base_url=server.base_url, api_key=API_KEY, max_retries=0, timeout=60)
        lines = [chat_line(f"q{i}", "Go on.", model, max_tokens=200, ignore_eos=True) for i in range(6)]
        upload = client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
        client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions",
                              completion_window="24h")
        deadline = time.monotonic() + 30
        while server.engine.metrics().running == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
    finally:
        started = time.monotonic()
        server.stop()
    assert not server.thread.is_alive() and time.monotonic() - started < 15


def test_responses_lines_are_not_stored_unless_they_ask(client, model):
    def response_line(custom_id: str, **extra) -> dict:
        return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
                "body": {"model": model, "input": "Say hi.", "max_output_tokens": 4, **extra}}

    lines = [response_line("plain"), response_line("kept", store=True),
             response_line("later", background=True)]
    upload = client.files.create(file=("responses.jsonl", jsonl(lines)), purpose="batch")
    batch = wait_until_done(client, client.batches.create(
        input_file_id=upload.id, endpoint="/v1/responses", completion_window="24h").id)
    answers = {a["custom_id"]: a["response"]["body"] for a in content_lines(client, batch.output_file_id)}
    assert answers["plain"]["store"] is False and answers["kept"]["store"] is True
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(answers["plain"]["id"])
    assert client.responses.retrieve(answers["kept"]["id"]).id == answers["kept"]["id"]
    (refused,) = content_lines(client, batch.error_file_id)
    assert refused["custom_id"] == "later" and refused["response"]["body"]["error"]["param"] == "background"


def test_a_bad_query_parameter_is_named_as_sent(running):
    r = httpx.get(f"{running.base_url}/files", params={"limit": "many"},
                  headers={"authorization": f"Bearer {API_KEY}"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit", r.text
