"""``POST /v1/feedback`` on the real app, engine and model: a completion's id takes a score
(recorded for SONA), bad input is 400, an unknown id (or SONA not attached) is 404."""

from __future__ import annotations

from fastapi.testclient import TestClient
from ruvllm.server.app import ServerSettings, create_app
from ruvllm_sona import SonaOptions, attach


def test_feedback_endpoint(engine, backend):
    sona = attach(engine, SonaOptions(interval=0), start=False)
    app = create_app(engine, ServerSettings(model_name="m"))
    client = TestClient(app)  # no lifespan: the engine fixture closes the engine
    done = client.post("/v1/chat/completions", json={
        "model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4})
    assert done.status_code == 200, done.text
    cid = done.json()["id"]
    ok = client.post("/v1/feedback", json={"id": cid, "score": 0.5})
    assert ok.status_code == 200 and ok.json()["status"] == "recorded"
    assert [r.feedback for r in sona.store.snapshot()] == [0.5]
    for bad in ({"id": cid, "score": 1.5}, {"id": cid}, {"id": cid, "score": "good"},
                {"id": cid, "score": 1, "extra": 1}, {"id": cid, "score": True}):
        r = client.post("/v1/feedback", json=bad)
        assert r.status_code == 400, (bad, r.text)
        assert r.json()["error"]["type"] == "invalid_request_error"
    missing = client.post("/v1/feedback", json={"id": "chatcmpl-unknown", "score": 1})
    assert missing.status_code == 404 and missing.json()["error"]["type"] == "not_found_error"
