"""LoRA adapters over HTTP on the real candle_like backend (embedded SmolLM2-135M).

Adapters named in the settings (``--lora``) and loaded at runtime are listed by ``/v1/models``
with their base model as ``parent`` and are picked with ``model=<adapter>``; their greedy output
differs from the base model's and equals the in-process engine's with that adapter. The runtime
endpoints need the opt-in flag and the API key; a backend without LoRA refuses with 400.

mistral.rs goes through the same code (``ServingEngine.publish`` -> ``backend.load_adapter``);
its HTTP round trip runs in tests/mistralrs/test_mistralrs_hf.py, on the LoRA runtime that module
already holds (about 0.7 GB, not loaded a second time here).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from ruvllm.config import load_config
from ruvllm.server.app import ServerSettings, create_app
from ruvllm.server.runner import load_engine
from ruvllm.types import GenerationParams
from server_helpers import API_KEY, _require_backend

# SmolLM2-135M: hidden 576, q_proj out 576, v_proj out 192 (3 KV heads of 64), 30 layers.
HIDDEN, Q_OUT, V_OUT, LAYERS = 576, 576, 192, 30
PROMPT = "The capital of France is"
MAX_TOKENS = 10
AUTH = {"Authorization": f"Bearer {API_KEY}"}


def write_peft(dst: Path, *, seed: int, rank: int = 8, scale: float = 0.15) -> str:
    """A real PEFT LoRA directory for SmolLM2-135M with non-zero A and B on q/v of every layer."""
    from safetensors.numpy import save_file

    dst.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    shapes = {"lora_A": lambda out: (rank, HIDDEN), "lora_B": lambda out: (out, rank)}
    tensors = {f"base_model.model.model.layers.{layer}.self_attn.{name}.{part}.weight":
               (rng.standard_normal(shape(out)) * scale).astype(np.float32)
               for layer in range(LAYERS) for name, out in (("q_proj", Q_OUT), ("v_proj", V_OUT))
               for part, shape in shapes.items()}
    save_file(tensors, str(dst / "adapter_model.safetensors"))
    (dst / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": ["q_proj", "v_proj"]}))
    return str(dst)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("peft")
    return {"style": write_peft(root / "style", seed=1), "other": write_peft(root / "other", seed=2)}


def engine_on(backend: str):
    _require_backend(backend)
    return load_engine(load_config(overrides={"backend": backend, "model": "default"}))


@pytest.fixture(scope="module")
def candle_engine():
    engine = engine_on("candle_like")
    yield engine
    engine.close()  # already shut down by the app's lifespan; closing twice is harmless


@pytest.fixture(scope="module")
def client(candle_engine, adapters):
    """The server with adapter ``style`` named in its settings (as ``--lora style=PATH``) and
    runtime loading allowed; its lifespan loads ``style`` and shuts the engine down at the end."""
    settings = ServerSettings(model_name="smol", api_key=API_KEY, lora_adapters={"style": adapters["style"]},
                              allow_runtime_lora=True)
    with TestClient(create_app(candle_engine, settings)) as c:
        yield c


def complete(client, model: str) -> str:
    r = client.post("/v1/completions", headers=AUTH,
                    json={"model": model, "prompt": PROMPT, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model
    return r.json()["choices"][0]["text"]


def in_process(engine, adapter: str | None) -> str:
    ids = engine.encode(PROMPT)
    return engine.generate_sync([ids], GenerationParams(max_tokens=MAX_TOKENS, adapter=adapter))[0].text


def model_ids(client) -> dict[str, dict]:
    r = client.get("/v1/models", headers=AUTH)
    assert r.status_code == 200
    return {m["id"]: m for m in r.json()["data"]}


def test_configured_adapter_is_listed_and_changes_output_like_in_process(client, candle_engine, adapters):
    listed = model_ids(client)
    assert listed["style"]["parent"] == "smol" and listed["style"]["root"] == adapters["style"]
    assert listed["smol"]["parent"] is None
    base, tuned = complete(client, "smol"), complete(client, "style")
    assert tuned != base
    assert base == in_process(candle_engine, None)
    assert tuned == in_process(candle_engine, "style")
    chat = client.post("/v1/chat/completions", headers=AUTH, json={
        "model": "style", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert chat.status_code == 200 and chat.json()["model"] == "style"


def test_load_at_runtime_then_unload_gives_404(client, candle_engine, adapters):
    r = client.post("/v1/load_lora_adapter", headers=AUTH,
                    json={"lora_name": "other", "lora_path": adapters["other"]})
    assert r.status_code == 200, r.text
    assert model_ids(client)["other"]["parent"] == "smol"
    loaded = complete(client, "other")
    assert loaded != complete(client, "smol") and loaded != complete(client, "style")
    assert loaded == in_process(candle_engine, "other")
    # The same name twice is refused, as vLLM does.
    again = client.post("/v1/load_lora_adapter", headers=AUTH,
                        json={"lora_name": "other", "lora_path": adapters["other"]})
    assert again.status_code == 400 and "already" in again.json()["error"]["message"]

    r = client.post("/v1/unload_lora_adapter", headers=AUTH, json={"lora_name": "other"})
    assert r.status_code == 200, r.text
    assert "other" not in model_ids(client)
    gone = client.post("/v1/completions", headers=AUTH, json={"model": "other", "prompt": PROMPT})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "model_not_found"
    missing = client.post("/v1/unload_lora_adapter", headers=AUTH, json={"lora_name": "other"})
    assert missing.status_code == 404


def test_bad_adapter_requests_are_400(client, tmp_path):
    cases = [({"lora_name": "x", "lora_path": str(tmp_path / "nowhere")}, "lora_path"),
             ({"lora_name": "x", "lora_path": str(tmp_path)}, "lora_path"),  # no PEFT files in it
             ({"lora_name": "smol", "lora_path": str(tmp_path)}, "lora_name")]
    for body, param in cases:
        r = client.post("/v1/load_lora_adapter", headers=AUTH, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_runtime_endpoints_need_the_api_key(client, adapters):
    for path, body in (("/v1/load_lora_adapter", {"lora_name": "k", "lora_path": adapters["other"]}),
                       ("/v1/unload_lora_adapter", {"lora_name": "style"})):
        assert client.post(path, json=body).status_code == 401
    assert "style" in model_ids(client)


def test_runtime_endpoints_are_off_without_the_opt_in(candle_engine, adapters):
    # No lifespan (no `with`): this app shares the module's engine and must not shut it down.
    app = create_app(candle_engine, ServerSettings(model_name="smol", api_key=API_KEY))
    c = TestClient(app)
    r = c.post("/v1/load_lora_adapter", headers=AUTH, json={"lora_name": "k", "lora_path": adapters["other"]})
    assert r.status_code == 403
    assert "--allow-runtime-lora" in r.json()["error"]["message"]
    assert c.post("/v1/unload_lora_adapter", headers=AUTH, json={"lora_name": "style"}).status_code == 403


def test_backend_without_lora_refuses_with_400(adapters):
    engine = engine_on("llamacpp")
    with TestClient(create_app(engine, ServerSettings(model_name="smol", allow_runtime_lora=True))) as c:
        r = c.post("/v1/load_lora_adapter", json={"lora_name": "k", "lora_path": adapters["other"]})
        assert r.status_code == 400
        assert "LoRA capability" in r.json()["error"]["message"]
        # A request naming an adapter that does not exist is a 404 too, not a backend failure.
        assert c.post("/v1/completions", json={"model": "k", "prompt": PROMPT}).status_code == 404
