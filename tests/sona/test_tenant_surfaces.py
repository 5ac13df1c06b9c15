"""Every API surface feeds the same tenant (issue 62): the end user each API names (OpenAI's
``user`` on chat, completions, the Responses API and a batch's lines; Anthropic's
``metadata.user_id`` on messages and message batches) is the request's tenant, so with SONA on
that user's requests run with that user's adapter on every surface, and another user's do not.
Ollama's API has no such field: its requests run without a tenant (docs/server.md).

What the engine ran is read from SONA's store: each finished request's trajectory records the
tenant it ran for and the adapter it ran with.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ruvllm.server.app import ServerSettings, create_app
from ruvllm_sona import SonaOptions, attach

from sona.helpers import TRAIN, wait_until

SAY_HI = [{"role": "user", "content": "Say hi."}]


def _ok(response) -> dict[str, Any]:
    assert response.status_code == 200, response.text
    return response.json()


def _chat(client: TestClient, user: str) -> None:
    _ok(client.post("/v1/chat/completions", json={"model": "m", "messages": SAY_HI, "max_tokens": 2,
                                                  "user": user}))


def _completions(client: TestClient, user: str) -> None:
    _ok(client.post("/v1/completions", json={"model": "m", "prompt": "Say hi.", "max_tokens": 2,
                                             "user": user}))


def _responses(client: TestClient, user: str) -> None:
    _ok(client.post("/v1/responses", json={"model": "m", "input": "Say hi.", "max_output_tokens": 2,
                                           "user": user}))


def _messages(client: TestClient, user: str) -> None:
    _ok(client.post("/v1/messages", json={"model": "m", "max_tokens": 2, "messages": SAY_HI,
                                          "metadata": {"user_id": user}}))


def _until(client: TestClient, path: str, ended: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    assert wait_until(lambda: ended(_ok(client.get(path))), timeout=120), _ok(client.get(path))
    return _ok(client.get(path))


def _batch(client: TestClient, user: str) -> None:
    line = {"custom_id": "hi", "method": "POST", "url": "/v1/chat/completions",
            "body": {"model": "m", "messages": SAY_HI, "max_tokens": 2, "user": user}}
    upload = _ok(client.post("/v1/files", data={"purpose": "batch"},
                             files={"file": ("in.jsonl", json.dumps(line).encode())}))
    batch = _ok(client.post("/v1/batches", json={"input_file_id": upload["id"], "completion_window": "24h",
                                                 "endpoint": "/v1/chat/completions"}))
    done = _until(client, f"/v1/batches/{batch['id']}", lambda b: b["status"] in ("completed", "failed"))
    assert done["request_counts"]["completed"] == 1, done


def _message_batch(client: TestClient, user: str) -> None:
    params = {"model": "m", "max_tokens": 2, "messages": SAY_HI, "metadata": {"user_id": user}}
    requests = [{"custom_id": "hi", "params": params}]
    batch = _ok(client.post("/v1/messages/batches", json={"requests": requests}))
    done = _until(client, f"/v1/messages/batches/{batch['id']}", lambda b: b["processing_status"] == "ended")
    assert done["request_counts"]["succeeded"] == 1, done


SURFACES = {"chat": _chat, "completions": _completions, "responses": _responses, "messages": _messages,
            "batches": _batch, "message_batches": _message_batch}


@pytest.fixture
def served(engine):
    """SONA on the engine, served; alice has taught an adapter of her own (one rated chat)."""
    sona = attach(engine, SonaOptions(**TRAIN), start=False)
    with TestClient(create_app(engine, ServerSettings(model_name="m"))) as client:
        answer = _ok(client.post("/v1/chat/completions", json={"model": "m", "messages": SAY_HI,
                                                               "max_tokens": 4, "user": "alice"}))
        _ok(client.post("/v1/feedback", json={"id": answer["id"], "score": 1.0}))
        sona.background_step()
        yield sona, client


def _ran(sona, send: Callable[[], None]) -> tuple[str | None, str | None]:
    """(tenant, adapter) of the one request ``send`` runs."""
    before = len(sona.store.snapshot())
    send()
    deadline = time.monotonic() + 5  # a batch's result may reach the store a moment after its status
    while len(sona.store.snapshot()) == before and time.monotonic() < deadline:
        time.sleep(0.01)
    (record,) = sona.store.snapshot()[before:]
    return record.trajectory.tenant, record.trajectory.adapter


@pytest.mark.parametrize("surface", list(SURFACES))
def test_each_surface_runs_a_user_with_that_users_adapter(served, backend, surface):
    sona, client = served
    alice = sona.adapter_name("alice")
    assert alice in backend.adapter_names()
    send = SURFACES[surface]
    assert _ran(sona, lambda: send(client, "alice")) == ("alice", alice)
    assert _ran(sona, lambda: send(client, "bob")) == ("bob", None)


def test_ollama_requests_have_no_tenant(served):
    sona, client = served
    body = {"model": "m", "messages": SAY_HI, "stream": False, "options": {"num_predict": 2}}
    assert _ran(sona, lambda: _ok(client.post("/api/chat", json=body))) == (None, None)
