"""Tenants learn apart, on the real engine and model: feedback on one tenant's requests changes that
tenant's outputs and no one else's (another tenant, requests without a tenant), resetting one tenant
returns its outputs to the base model's bit for bit and leaves the others' learning as it was, and
``reset`` returns everyone to the base model. The server's ``user`` is the tenant."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from ruvllm.errors import InvalidRequest
from ruvllm.server.app import ServerSettings, create_app
from ruvllm.types import GenerationParams
from ruvllm_sona import SonaOptions, attach

from sona.helpers import TOPICS, TRAIN, greedy, serve

#: One of the longest files (23 s of one worker, pinned): handed out with the first units
#: (tests/conftest.py), not last in collection order, so that the run ends on short ones.
pytestmark = pytest.mark.long_unit


def test_tenants_learn_apart_and_reset_to_the_exact_base(engine, backend, ask):
    base = greedy(engine, ask)  # without SONA a tenant changes nothing
    sona = attach(engine, SonaOptions(**TRAIN, learning_rate=2e-2, steps_per_update=2, ewc_lambda=5.0),
                  start=False)
    prompts = [ask(f"Write one short sentence about {t}.") for t in TOPICS]
    for tenant, score in (("alice", 1.0), ("bob", -1.0)):
        for rid, _ in serve(engine, prompts, range(1), tenant=tenant):
            engine.feedback(rid, score)
    sona.background_step()  # one update per tenant with feedback, each on its own requests
    names = {sona.adapter_name("alice"), sona.adapter_name("bob")}
    assert set(backend.adapter_names()) == names and len(names) == 2 and "alice" not in str(names)
    learned = {t: greedy(engine, ask, t) for t in ("alice", "bob")}
    assert learned["alice"] != base and learned["bob"] != base
    assert learned["alice"] != learned["bob"]
    # Nobody else is touched: a tenant without feedback, and requests without a tenant.
    assert greedy(engine, ask, "carol") == base
    assert greedy(engine, ask) == base
    assert sona.select_adapter(tuple(prompts[0]), "carol") is None

    sona.reset_tenant("alice")
    assert backend.adapter_names() == (sona.adapter_name("bob"),)
    tenants = {r.trajectory.tenant for r in sona.store.snapshot()}
    assert "alice" not in tenants and "bob" in tenants  # her requests are forgotten too
    assert greedy(engine, ask, "alice") == base  # alice's outputs: the base model's exactly
    assert greedy(engine, ask, "bob") == learned["bob"]  # bob keeps what he taught
    sona.reset()
    assert backend.adapter_names() == ()
    assert [greedy(engine, ask, t) for t in ("alice", "bob")] == [base, base]


def test_the_servers_user_is_the_tenant(engine, backend):
    sona = attach(engine, SonaOptions(interval=0), start=False)
    client = TestClient(create_app(engine, ServerSettings(model_name="m")))
    for user in ("alice", None):
        body = {"model": "m", "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}
        done = client.post("/v1/chat/completions", json=body if user is None else {**body, "user": user})
        assert done.status_code == 200, done.text
        ok = client.post("/v1/feedback", json={"id": done.json()["id"], "score": 1.0})
        assert ok.status_code == 200, ok.text
    assert [(r.trajectory.tenant, r.feedback) for r in sona.store.snapshot()] == [("alice", 1.0), (None, 1.0)]


def test_a_tenant_is_a_string():
    with pytest.raises(InvalidRequest) as err:
        GenerationParams(tenant=7)
    assert err.value.field == "user"
