"""``ruvllm serve --ray`` on one real local Ray instance (num_cpus=2): 2 replicas of the embedded
model behind the unchanged OpenAI app, driven by the official ``openai`` client.

One Ray instance and one Serve app for the module (~15 s to start), shut down at the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import httpx
import openai
import pytest

pytest.importorskip("ray.serve")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from scaleout_helpers import abandon_stream_and_see_cancel, finished
from server_helpers import _require_backend, free_port, start_server

SYSTEM = ("You are a careful assistant for a library. Answer in one short sentence, never more, "
          "and do not repeat the question. The library opens at nine and closes at five on "
          "weekdays; on Saturdays it opens at ten and closes at two; it is closed on Sundays. "
          "Members may borrow up to six books for three weeks and renew them twice online.")


@attrs.define
class RayApp:
    url: str
    client: object


@pytest.fixture(scope="module")
def ray_app() -> Iterator[RayApp]:
    import ray
    from ray import serve
    from ruvllm.config import load_config
    from ruvllm.scaleout.app import ScaleOutSettings, build_replicas, http_in_thread

    _require_backend("llamacpp")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(proxy_location="Disabled")
        config = load_config(overrides={"backend": "llamacpp", "model": "default"})
        config = attrs.evolve(config, server=attrs.evolve(config.server, port=free_port()))
        scale = ScaleOutSettings(name="ruvllm-test", replicas=2, ray_actor_options={"num_cpus": 0.5},
                                 busy_threshold=8)
        serve.run(build_replicas(config, scale), name=scale.name, route_prefix=None)
        with http_in_thread(config, scale) as url:
            yield RayApp(url=url, client=openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0,
                                                       timeout=60))
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def direct():
    running = start_server(api_key=None)
    yield openai.OpenAI(base_url=running.base_url, api_key="none", max_retries=0, timeout=60)
    running.stop()


def _replicas(url: str) -> dict[str, dict]:
    return {r["replica_id"]: r for r in httpx.get(url + "/ray/replicas", timeout=10).json()["replicas"]}


def _settled(url: str, finished_at_least: int, timeout: float = 10.0) -> dict[str, dict]:
    """Per-replica counters once the replicas have reported ``finished_at_least`` requests."""
    deadline = time.monotonic() + timeout
    while True:
        reps = _replicas(url)
        if sum(sum(r["requests_finished"].values()) for r in reps.values()) >= finished_at_least \
                or time.monotonic() > deadline:
            return reps
        time.sleep(0.2)


def _cpu_ticks(pid: int) -> int:
    """User + system CPU time of process ``pid`` so far, in clock ticks."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def test_greedy_outputs_match_single_process_serve(ray_app, direct):
    model = ray_app.client.models.list().data[0].id
    assert model == direct.models.list().data[0].id
    msgs = [{"role": "user", "content": "Name three colours."}]
    a = ray_app.client.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0)
    b = direct.chat.completions.create(model=model, messages=msgs, max_tokens=24, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content
    cacheless = {"prompt_tokens_details"}  # what each server's prefix cache held before differs
    assert a.usage.model_dump(exclude=cacheless) == b.usage.model_dump(exclude=cacheless)
    stream = ray_app.client.completions.create(model=model, prompt="The capital of France is", max_tokens=16,
                                               temperature=0, stream=True)
    streamed = "".join(c.choices[0].text for c in stream if c.choices)
    whole = direct.completions.create(model=model, prompt="The capital of France is", max_tokens=16,
                                      temperature=0)
    assert streamed == whole.choices[0].text
    tok = httpx.post(ray_app.url + "/tokenize", json={"prompt": "hello world"}).json()
    assert tok["tokens"] == httpx.post(str(direct.base_url).replace("/v1/", "/tokenize"),
                                       json={"prompt": "hello world"}).json()["tokens"]


def test_shared_prefix_requests_go_to_one_replica(ray_app):
    client = ray_app.client
    model = client.models.list().data[0].id
    before = _settled(ray_app.url, 0)
    n = 6
    for i in range(n):
        client.chat.completions.create(model=model, max_tokens=4, temperature=0, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": f"Question {i}: when?"}])
    after = _settled(ray_app.url, finished(before) + n)
    grew = {rid: (r["prefix_cache_queries"] - before.get(rid, {}).get("prefix_cache_queries", 0),
                  r["prefix_cache_hits"] - before.get(rid, {}).get("prefix_cache_hits", 0))
            for rid, r in after.items()}
    served = [rid for rid, (q, _) in grew.items() if q > 0]
    assert len(served) == 1, f"shared-prefix requests were spread over replicas: {grew}"
    _, hits = grew[served[0]]
    # Every request after the first finds the shared system prompt (> 64 tokens) in that cache.
    assert hits >= (n - 1) * 64, grew


def test_disconnect_cancels_on_the_replica(ray_app):
    model = ray_app.client.models.list().data[0].id
    abandon_stream_and_see_cancel(ray_app.client, model, lambda: _replicas(ray_app.url))


def test_killing_a_replica_fails_its_request_and_the_app_keeps_serving(ray_app):
    from ray import serve

    client = ray_app.client
    model = client.models.list().data[0].id
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Tell a long story."}]
    # Replicas are listed once they have finished a request: prompts whose first KV blocks differ
    # have different home replicas (a prompt shorter than the affinity key goes to the least loaded).
    for n in range(12):
        if len(_replicas(ray_app.url)) == 2:
            break
        client.completions.create(model=model, prompt=f"Note {n}: " + "the river runs past the mill. " * 12,
                                  max_tokens=1)
    pids = [r["pid"] for r in _replicas(ray_app.url).values()]
    assert len(pids) == 2, pids
    stream = client.chat.completions.create(model=model, messages=msgs, max_tokens=300, temperature=0,
                                            stream=True)
    # Kill the replica serving the stream mid-way: the one computing (the router may send the
    # request to either, so it is found by the CPU time each replica spends between two chunks).
    with pytest.raises(openai.APIError) as info:
        for i, _ in enumerate(stream):
            if i == 1:
                before = {pid: _cpu_ticks(pid) for pid in pids}
            if i == 8:
                spent = {pid: _cpu_ticks(pid) - before[pid] for pid in pids}
                os.kill(max(spent, key=spent.__getitem__), signal.SIGKILL)
    assert "died" in str(info.value.message if hasattr(info.value, "message") else info.value)
    # The other replica serves at once; Serve restarts the dead one.
    for _ in range(3):
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}],
                                           max_tokens=4, temperature=0)
        assert r.choices[0].message.content
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        status = serve.status().applications["ruvllm-test"].deployments["ruvllm-test-replicas"]
        if status.status == "HEALTHY" and status.replica_states.get("RUNNING", 0) == 2:
            break
        time.sleep(0.5)
    else:
        pytest.fail(f"Serve did not restart the killed replica: {status}")


# ---------------------------------------------------------------- constrained output through --ray

S = {"type": "string", "maxLength": 16}
SCHEMAS = [
    {"type": "object", "properties": {"name": S, "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "ok": {"type": "boolean"}},
     "required": ["color", "ok"], "additionalProperties": False},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 2, "maxItems": 3},
]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": S, "unit": {"enum": ["c", "f"]}},
                   "required": ["city", "unit"], "additionalProperties": False}}}


def test_constrained_output_is_enforced_on_the_replicas(ray_app):
    jsonschema = pytest.importorskip("jsonschema")
    client = ray_app.client
    model = client.models.list().data[0].id

    def schema_answer(i: int):
        return client.chat.completions.create(
            model=model, temperature=0.8, max_tokens=80, seed=i,
            messages=[{"role": "user", "content": "Reply with a JSON value for this task."}],
            response_format={"type": "json_schema", "json_schema": {
                "name": f"s{i}", "schema": SCHEMAS[i], "strict": True}}).choices[0]

    def choice_answer(_):
        return client.chat.completions.create(
            model=model, temperature=0.8, max_tokens=8, messages=[{"role": "user", "content": "Pick one."}],
            extra_body={"guided_choice": ["alpha", "beta", "gamma"]}).choices[0]

    def tool_answer(_):
        return client.chat.completions.create(
            model=model, temperature=0.8, max_tokens=80, seed=5, tools=[WEATHER], tool_choice="required",
            parallel_tool_calls=False, messages=[{"role": "user", "content": "Weather in Paris?"}]).choices[0]

    with ThreadPoolExecutor(len(SCHEMAS) + 2) as pool:  # all at once: the replicas batch them
        futures = [pool.submit(schema_answer, i) for i in range(len(SCHEMAS))]
        picked, called = pool.submit(choice_answer, None), pool.submit(tool_answer, None)
        schemas = [f.result() for f in futures]
        picked, called = picked.result(), called.result()
    for schema, choice in zip(SCHEMAS, schemas, strict=True):
        assert choice.finish_reason == "stop", (schema, choice.message.content)
        jsonschema.validate(json.loads(choice.message.content), schema)
    assert picked.message.content in ("alpha", "beta", "gamma")
    assert called.finish_reason == "tool_calls", called
    (call,) = called.message.tool_calls
    assert call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


def test_a_bad_schema_is_a_400_naming_the_field_through_ray(ray_app):
    client = ray_app.client
    model = client.models.list().data[0].id
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=model, max_tokens=8, messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_schema",
                             "json_schema": {"name": "b", "schema": {"type": "bogus"}}})
    assert info.value.body["param"] == "response_format.json_schema.schema", info.value.body
