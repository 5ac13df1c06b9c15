"""The server never tokenizes a prompt on its event loop: completions, chat and /tokenize encode
through the engine's model thread (``encode_async``), so a long prompt cannot stall the other
requests' streams. On the fake engine of tests/engine (no model needed)."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.server.app import ServerSettings, create_app

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
from engine_fakes import FakeBackend, FakeTokenizer, PagedFakeExecutor


@pytest.fixture
def encodes(monkeypatch):
    """(thread name, text) of every encode call."""
    calls: list[tuple[str, str]] = []
    original = FakeTokenizer.encode

    def recording(self, text, **kw):
        calls.append((threading.current_thread().name, text))
        if "slow" in text:
            time.sleep(1.0)
        return original(self, text, **kw)

    monkeypatch.setattr(FakeTokenizer, "encode", recording)
    return calls


@pytest.fixture
def client():
    engine = ServingEngine(FakeBackend(PagedFakeExecutor(num_blocks=64, block_size=4)),
                           EngineOptions(block_size=4))
    with TestClient(create_app(engine, ServerSettings(model_name="m"))) as c:  # lifespan closes it
        yield c


def test_prompts_are_tokenized_on_the_model_thread(client, encodes):
    tok = FakeTokenizer()
    echoes = [tok.decode(tok.encode(p)) for p in ("one", "three")]
    encodes.clear()
    r = client.post("/v1/completions", json={"model": "m", "prompt": ["one", "three"], "max_tokens": 2,
                                             "echo": True})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["prompt_tokens"] == 3 + 5
    assert [c["text"][: len(e)] for c, e in zip(r.json()["choices"], echoes, strict=True)] == echoes
    assert client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}).status_code == 200
    tok = client.post("/tokenize", json={"prompt": "four"}).json()
    assert tok["count"] == 4
    assert client.post("/tokenize", json={"messages": [{"role": "user", "content": "x"}]}).status_code == 200
    texts = [text for _, text in encodes]
    assert texts[:2] == ["one", "three"] and "four" in texts and len(texts) == 5
    assert {thread for thread, _ in encodes} == {"ruvllm-model"}


def test_a_slow_prompt_does_not_hold_up_the_event_loop(client, encodes):
    """While one prompt takes a second to tokenize, /health is answered at once."""
    done = {}

    def slow() -> None:
        done["status"] = client.post("/tokenize", json={"prompt": "slow " * 50}).status_code

    worker = threading.Thread(target=slow)
    worker.start()
    while not encodes:
        time.sleep(0.01)
    start = time.perf_counter()
    assert client.get("/health").status_code == 200
    assert time.perf_counter() - start < 0.5
    worker.join()
    assert done["status"] == 200
