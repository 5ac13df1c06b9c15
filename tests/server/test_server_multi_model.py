"""Several models in one server: ``[[models]]`` tables, routing by ``model``, lazy loading with
503 + Retry-After while a model loads, unloading after ``keep_alive``, per-model metrics, and the
memory budget's least-recently-used unloading.

The two real models are the embedded SmolLM2 under two backends (llamacpp and candle_like).
The budget test uses fake engines: it checks the pool's bookkeeping, not a backend.
"""

from __future__ import annotations

import asyncio
import time

import attrs
import pytest
from fastapi.testclient import TestClient
from ruvllm.config import ModelConfig, load_config
from ruvllm.errors import ConfigError, ModelNotFound, Overloaded
from ruvllm.server.app import create_app
from ruvllm.server.lifecycle.model_pool import ModelPool, ModelSpec, ModelState
from ruvllm.server.runner import build_pool, pool_settings, with_cli_models
from server_helpers import _require_backend

TOML = """
[engine]
max_num_seqs = 4

[server]
load_wait = 60

[[models]]
name = "llama"
model = "default"
backend = "llamacpp"
preload = true

[[models]]
name = "candle"
model = "default"
backend = "candle_like"
keep_alive = "1s"
"""


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    _require_backend("llamacpp")
    _require_backend("candle_like")
    path = tmp_path_factory.mktemp("cfg") / "ruvllm.toml"
    path.write_text(TOML)
    return load_config(path, env={})


def states(client) -> dict[str, str]:
    return {m["id"]: m["state"] for m in client.get("/v1/models").json()["data"]}


def complete(client, model: str | None) -> dict:
    r = client.post("/v1/completions", json={"model": model, "prompt": "Paris is", "max_tokens": 4,
                                             "temperature": 0})
    assert r.status_code == 200, r.text
    return r.json()


def test_config_reads_models_tables(config):
    assert [(m.name, m.backend, m.keep_alive, m.preload) for m in config.models] == [
        ("llama", "llamacpp", None, True), ("candle", "candle_like", 1.0, False)]
    with pytest.raises(ConfigError, match="keep_alive"):
        ModelConfig(name="x", model="default", keep_alive="soon")


def test_two_models_route_by_name_and_the_idle_one_unloads(config):
    pool = build_pool(config)
    with TestClient(create_app(pool, pool_settings(config, pool))) as client:
        wait_for(lambda: states(client)["llama"] == "loaded")  # preloaded at start
        assert states(client)["candle"] == "unloaded"  # lazy: nothing loaded it yet
        llama = complete(client, "llama")
        candle = complete(client, "candle")  # loads it (within load_wait), then answers
        assert (llama["model"], candle["model"]) == ("llama", "candle")
        assert complete(client, None)["model"] == "llama"  # no model: the first one
        cards = {m["id"]: m for m in client.get("/v1/models").json()["data"]}
        assert cards["llama"]["backend"] == "llamacpp" and cards["candle"]["backend"] == "candle_like"
        metrics = client.get("/metrics").text
        for name, backend in (("llama", "llamacpp"), ("candle", "candle_like")):
            line = next(x for x in metrics.splitlines() if x.startswith("ruvllm:generation_tokens_total{")
                        and f'model_name="{name}"' in x)
            assert f'backend="{backend}"' in line and float(line.split()[-1]) >= 4
        missing = client.post("/v1/completions", json={"model": "nope", "prompt": "x"})
        assert missing.status_code == 404 and "'llama', 'candle'" in missing.json()["error"]["message"]

        # keep_alive = 1 s: candle unloads once idle; llama (no keep_alive) stays.
        wait_for(lambda: states(client)["candle"] == "unloaded", timeout=15)
        assert states(client)["llama"] == "loaded"
        assert 'model_name="candle"' in client.get("/metrics").text  # its counters are kept
        assert complete(client, "candle")["model"] == "candle"  # and it loads again on use


def test_a_request_during_loading_gets_503_with_retry_after(config):
    config = attrs.evolve(config, server=attrs.evolve(config.server, load_wait=0.0),
                          models=(attrs.evolve(config.models[0], preload=False),))
    pool = build_pool(config)
    with TestClient(create_app(pool, pool_settings(config, pool))) as client:
        r = client.post("/v1/completions", json={"model": "llama", "prompt": "Paris is", "max_tokens": 2})
        assert r.status_code == 503
        assert int(r.headers["retry-after"]) >= 1
        assert "loading" in r.json()["error"]["message"]
        wait_for(lambda: states(client)["llama"] == "loaded")
        assert complete(client, "llama")["model"] == "llama"


def test_cli_models_make_a_pool(config):
    two = with_cli_models(config, "default", ("other=default",))
    assert [(m.name, m.model, m.preload) for m in two.models] == [("default", "default", True),
                                                                   ("other", "default", True)]
    one = with_cli_models(config, None, ("default",))
    assert one.models == () and one.model == "default"


# ---------------------------------------------------------------------- the pool's bookkeeping


@attrs.define
class _Snapshot:
    running: int = 0
    waiting: int = 0


@attrs.define
class FakeEngine:
    """Only what the pool touches: metrics() and shutdown() (the AsyncEngine protocol's)."""

    name: str
    busy: bool = False
    closed: bool = False
    backend_name: str = "fake"

    def metrics(self) -> _Snapshot:
        return _Snapshot(running=int(self.busy))

    async def shutdown(self) -> None:
        self.closed = True


def test_memory_budget_unloads_the_least_recently_used_idle_model():
    made: dict[str, FakeEngine] = {}

    def spec(name: str) -> ModelSpec:
        return ModelSpec(name=name, loader=lambda: made.setdefault(name, FakeEngine(name)),
                         memory_estimate=lambda: 40)

    async def run() -> None:
        pool = ModelPool([spec("a"), spec("b"), spec("c")], memory_budget=100, load_wait=5)
        for name in ("a", "b"):
            async with pool.route(name) as route:
                assert route.engine is made[name] and route.adapter is None
        async with pool.route("a"):
            pass  # a is now the most recently used
        async with pool.route("c"):  # 3 x 40 > 100: b (least recently used) makes room
            states = {n: e.state for n, e in pool.entries.items()}
            assert states == {"a": ModelState.LOADED, "b": ModelState.UNLOADED, "c": ModelState.LOADED}
            assert made["b"].closed and not made["a"].closed
            made["a"].busy = True  # a request still running there: a cannot be unloaded
            made.pop("b")
            with pytest.raises(Overloaded, match="memory budget"):
                async with pool.route("b"):
                    pass  # c is leased and a is busy
        with pytest.raises(ModelNotFound):
            pool.entry_for("d")
        await pool.shutdown()
        assert all(e.closed for e in made.values())

    asyncio.run(run())


def test_a_model_loading_for_a_request_is_not_unloaded_before_the_request_gets_it():
    """keep_alive 0 (an earlier request asked the model to go when idle): the reaper ran just
    as the load finished, before the waiting request resumed, unloaded the model, and the
    request failed with a 500 (an assertion). The request holds its lease while it waits."""
    made: list[FakeEngine] = []

    async def run() -> None:
        pool = ModelPool([ModelSpec(name="a", loader=lambda: made.append(FakeEngine("a")) or made[-1],
                                    keep_alive=0)], load_wait=5)
        # The reaper's turn right after the load, ahead of the request's own wake-up.
        pool.on_loaded.append(lambda entry: asyncio.ensure_future(pool.reap()))
        for _ in range(3):
            async with pool.route("a") as route:
                assert route.engine is made[-1] and not made[-1].closed
                await asyncio.sleep(0)  # the reaper's task runs while the request holds the model
                assert not made[-1].closed
            await pool.reap()  # idle now, with keep_alive 0: it goes
            assert made[-1].closed and pool.entries["a"].state is ModelState.UNLOADED
        await pool.shutdown()

    asyncio.run(run())
