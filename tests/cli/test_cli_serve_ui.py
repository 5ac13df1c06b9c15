"""``ruvllm serve`` and its chat page: the real command prints the page's address and serves it;
``--no-ui`` (or ``[server] ui = false``) leaves only the API, and ``/`` is Ollama's probe alone."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from ruvllm.config import load_config
from ruvllm.plugins import get_registry
from ruvllm.server.ui.page import page_url

RUVLLM = Path(sys.executable).parent / "ruvllm"
HTML = {"Accept": "text/html,application/xhtml+xml,*/*;q=0.8"}


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(tmp_path: Path, *flags: str) -> tuple[subprocess.Popen, str, Path]:
    """``ruvllm serve`` on a free port, up and answering; its stderr goes to a file."""
    if "llamacpp" not in get_registry().backends:
        pytest.skip("the llamacpp backend is not installed")
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    with log.open("w") as err:
        proc = subprocess.Popen([str(RUVLLM), "serve", "--backend", "llamacpp", "--port", str(port), *flags],
                                stdout=subprocess.DEVNULL, stderr=err, text=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return proc, url, log
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    proc.terminate()
    pytest.fail(f"ruvllm serve did not answer in 90 s:\n{log.read_text()}")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    proc.wait(timeout=30)


def test_serve_prints_the_chat_page_address_and_serves_it(tmp_path: Path):
    proc, url, log = serve(tmp_path)
    try:
        assert f"ruvllm: chat page: {url}/\n" in log.read_text()
        page = httpx.get(url + "/", headers=HTML)
        assert page.headers["content-type"].startswith("text/html") and "/ui/app.js" in page.text
    finally:
        stop(proc)


def test_no_ui_leaves_the_api_and_ollamas_probe(tmp_path: Path):
    proc, url, log = serve(tmp_path, "--no-ui")
    try:
        assert "chat page" not in log.read_text()
        assert httpx.get(url + "/", headers=HTML).text == "Ollama is running"
        assert httpx.get(url + "/ui").status_code == 404
        assert httpx.get(url + "/ui/app.js").status_code == 404
    finally:
        stop(proc)


def test_the_config_file_turns_the_page_off(tmp_path: Path):
    off, default = tmp_path / "off.toml", tmp_path / "default.toml"
    off.write_text("[server]\nui = false\n")
    default.write_text("")
    assert load_config(off, env={}).server.ui is False
    assert load_config(default, env={}).server.ui is True


def test_page_url_is_an_address_a_local_browser_opens():
    assert page_url("127.0.0.1", 8000) == "http://127.0.0.1:8000/"
    assert page_url("0.0.0.0", 8080) == "http://127.0.0.1:8080/"
    assert page_url("::", 8000) == "http://[::1]:8000/"
    assert page_url("::1", 8000) == "http://[::1]:8000/"
    assert page_url("example.lan", 80) == "http://example.lan:80/"
