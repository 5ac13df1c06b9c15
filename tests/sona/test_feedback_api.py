"""``POST /v1/feedback`` on the real app, engine and model: a completion's id takes a score
(recorded for SONA), bad input is 400, an unknown id (or SONA not attached) is 404; what SONA
then does shows in ``GET /metrics``."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from ruvllm.server.app import ServerSettings, create_app
from ruvllm_sona import SonaOptions, attach

from sona.helpers import TRAIN


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


def sona_series(client: TestClient) -> dict[str, float]:
    text = client.get("/metrics").text
    return {s.name.removeprefix("ruvllm:sona_"): s.value for f in text_string_to_metric_families(text)
            for s in f.samples if s.name.startswith("ruvllm:sona_") and not s.name.endswith("_created")}


def test_metrics_show_what_sona_learned_and_what_it_cost(engine, backend):
    sona = attach(engine, SonaOptions(**TRAIN, steps_per_update=1), start=False)
    client = TestClient(create_app(engine, ServerSettings(model_name="m")))
    zero = {"feedback_total": 0, "updates_total": 0, "update_seconds_total": 0, "consolidations_total": 0,
            "scores_waiting": 0, "requests_stored": 0, "tenants": 0}
    assert sona_series(client) == zero
    ids = []
    for user in ("alice", None):
        done = client.post("/v1/chat/completions", json={
            "model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 6,
            **({"user": user} if user else {})})
        ids.append(done.json()["id"])
    for cid in ids:
        assert client.post("/v1/feedback", json={"id": cid, "score": 1}).status_code == 200
    assert sona_series(client) == {**zero, "feedback_total": 2, "scores_waiting": 2, "requests_stored": 2}
    sona.background_step()  # one update per tenant with new scores
    after = sona_series(client)
    assert after["update_seconds_total"] > 0
    assert after == {**zero, "feedback_total": 2, "updates_total": 2, "requests_stored": 2, "tenants": 2,
                     "update_seconds_total": after["update_seconds_total"]}
    sona.deep("test", tenant="alice")
    sona.reset()  # forgetting what was learned does not take back what was counted
    assert sona_series(client) == {**after, "consolidations_total": 1, "requests_stored": 0, "tenants": 0}
    attach(engine, SonaOptions(**TRAIN), start=False)  # nor does binding SONA anew: its counts go on
    reported = {m.name: m.value for m in engine.metrics().plugins}
    assert (reported["sona_feedback_total"], reported["sona_updates_total"]) == (2, 2)
