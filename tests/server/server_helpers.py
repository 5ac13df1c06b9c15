"""Start a real uvicorn server on a free local port, over the real ServingEngine and llamacpp backend."""

from __future__ import annotations

import socket
import threading
import time

import attrs
import pytest
from ruvllm.config import load_config
from ruvllm.plugins import get_registry

API_KEY = "test-key-123"


def _require_backend(name: str = "llamacpp") -> None:
    """Fail, not skip, where the backend is missing: ``make setup`` installs the server tests'
    backends (llamacpp, candle_like), so a missing one is a broken set-up, and a suite that skipped
    as a whole would pass having tested nothing."""
    reg = get_registry()
    cls = reg.backends.get(name)
    if cls is None:
        pytest.fail(f"the {name} backend is not installed (pip install -e plugins/{name})", pytrace=False)
    reason = cls.unavailable_reason()
    if reason:
        pytest.fail(f"{name} backend unavailable: {reason}", pytrace=False)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@attrs.define
class RunningServer:
    url: str
    engine: object
    server: object
    thread: threading.Thread

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=20)


#: The embedding limit of ``short_embedding_server`` (conftest.py).
SHORT_EMBEDDING_TOKENS = 48


def start_server(*, api_key: str | None = API_KEY, engine_options: dict | None = None,
                 server: dict | None = None, backend: str = "llamacpp",
                 backend_options: dict | None = None, model: str = "default",
                 max_context: int | None = None, reloadable: bool = False) -> RunningServer:
    """A real server on a free port. ``backend_options``: the backend's table, as ``--option``
    sets it. ``reloadable``: a request's ``keep_alive`` may unload its model, as under ``ruvllm
    serve`` (off by default: tests hold the engine they started)."""
    from ruvllm.server.runner import load_engine, settings_for

    _require_backend(backend)
    config = load_config(overrides={"backend": backend, "model": model}, backend_options=backend_options)
    config = attrs.evolve(config, server=attrs.evolve(config.server, api_key=api_key, **(server or {})))
    config = config.with_engine(engine_options)  # the engine's and the settings' (batch_window)
    engine = load_engine(config)
    from ruvllm.server.app import create_app

    settings = settings_for(config, engine, max_context=max_context)
    if reloadable:
        settings = attrs.evolve(settings, reload=lambda: load_engine(config))
    return serve_app(create_app(engine, settings), engine)


def serve_app(app, engine: object) -> RunningServer:
    """``app`` served by uvicorn on a free port in a thread, once it accepts connections."""
    import uvicorn

    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                        timeout_graceful_shutdown=2))
    thread = threading.Thread(target=srv.run, name=f"uvicorn-{port}", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    return RunningServer(url=f"http://127.0.0.1:{port}", engine=engine, server=srv, thread=thread)


