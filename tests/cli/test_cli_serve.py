"""``ruvllm serve`` with several ``--model`` and ``--lora`` flags: the real command in a subprocess."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from ruvllm.plugins import get_registry

RUVLLM = Path(sys.executable).parent / "ruvllm"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_two_models_from_the_command_line():
    if "llamacpp" not in get_registry().backends:
        pytest.skip("the llamacpp backend is not installed")
    port = free_port()
    proc = subprocess.Popen([str(RUVLLM), "serve", "--backend", "llamacpp", "-m", "small=default",
                             "-m", "other=default", "--port", str(port), "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        states: dict[str, str] = {}
        while time.monotonic() < deadline and set(states.values()) != {"loaded"}:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                data = httpx.get(f"{url}/v1/models", timeout=5).json()["data"]
                states = {m["id"]: m["state"] for m in data}
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert states == {"small": "loaded", "other": "loaded"}  # --model preloads
        r = httpx.post(f"{url}/v1/completions", json={"model": "other", "prompt": "Hi", "max_tokens": 2},
                       timeout=60)
        assert r.status_code == 200 and r.json()["model"] == "other"
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_serve_refuses_a_malformed_lora_flag():
    proc = subprocess.run([str(RUVLLM), "serve", "--lora", "no-path", "--port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "NAME=PATH" in proc.stderr and "Traceback" not in proc.stderr
