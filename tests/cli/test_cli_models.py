"""``ruvllm download / list / info`` through click's CliRunner, against a local fake hub."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from ruvllm.cli import main
from ruvllm.plugins import get_registry
from ruvllm.registry import embedded_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
from hub_fixture import HubFixture


@pytest.fixture
def hub():
    with HubFixture() as fixture, fixture.patched():
        yield fixture


def run(*args: str, cache: Path):
    return CliRunner().invoke(main, ["--cache-dir", str(cache), *args])


def test_download_gguf_then_list_and_info(hub, tmp_path):
    gguf_bytes = embedded_model_path().read_bytes()
    hub.add_repo("acme/tiny-GGUF", {"tiny.gguf": gguf_bytes, "README.md": b"hi"})
    res = run("download", "acme/tiny-GGUF:tiny.gguf", cache=tmp_path)
    assert res.exit_code == 0, res.output
    assert "downloaded acme/tiny-GGUF:tiny.gguf" in res.output
    path = Path(res.output.split(" -> ")[1].split(" (")[0])
    assert path.read_bytes() == gguf_bytes

    listed = json.loads(run("list", "--downloaded", "--json", cache=tmp_path).output)
    names = {r["name"]: r for r in listed}
    assert "default" in names and "acme/tiny-GGUF" in names
    assert names["acme/tiny-GGUF"]["size"] >= len(gguf_bytes)
    assert all(r["downloaded"] for r in listed)
    assert "tinyllama" not in names  # an alias not downloaded is left out

    # A second download is served from the cache: no file is fetched again.
    hub.requests.clear()
    again = run("download", "acme/tiny-GGUF:tiny.gguf", cache=tmp_path)
    assert again.exit_code == 0
    assert not any(m == "GET" and p.endswith("/tiny.gguf") for m, p in hub.requests), hub.requests
    forced = run("download", "acme/tiny-GGUF:tiny.gguf", "--force", cache=tmp_path)
    assert forced.exit_code == 0
    assert any(m == "GET" and p.endswith("/tiny.gguf") for m, p in hub.requests), hub.requests

    info = json.loads(run("info", str(path), "--json", cache=tmp_path).output)
    assert info["architecture"] == "llama" and info["quantization"] == "Q4_1"
    assert info["parameters"] == 134_515_008 and info["chat_template"] is True
    assert info["disk_usage"] == len(gguf_bytes)


def test_download_unknown_repo_is_one_line_error(hub, tmp_path):
    res = run("download", "acme/missing:model.gguf", cache=tmp_path)
    assert res.exit_code == 1
    assert res.output.startswith("error: ") and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1


def test_list_shows_aliases_and_embedded(tmp_path):
    res = run("list", "--long", cache=tmp_path)
    assert res.exit_code == 0
    for name in ("default", "tinyllama", "qwen2.5-0.5b"):
        assert name in res.output
    assert "MB" in res.output  # the embedded model's size


def test_info_embedded_and_not_downloaded(tmp_path):
    res = run("info", "default", cache=tmp_path)
    assert res.exit_code == 0
    for word in ("llama", "134.5M", "Q4_1", "chat template", "yes"):
        assert word in res.output
    res = run("info", "tinyllama", "--json", cache=tmp_path)
    facts = json.loads(res.output.split("\nnot downloaded")[0])
    assert facts["downloaded"] is False and facts["repo"].startswith("TheBloke/")


def test_info_rejects_garbage_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"not a gguf file at all")
    res = run("info", str(bad), cache=tmp_path)
    assert res.exit_code == 1 and "not a GGUF file" in res.output


def test_serve_refuses_a_model_that_cannot_load(tmp_path):
    """The real command in a subprocess: exit code 1, the reason, no traceback, no server."""
    if "llamacpp" not in get_registry().backends:
        pytest.skip("the llamacpp backend is not installed")
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + bytes(64))
    ruvllm = Path(sys.executable).parent / "ruvllm"
    proc = subprocess.run([str(ruvllm), "serve", str(bad), "--backend", "llamacpp", "--port", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "error:" in proc.stderr and "Traceback" not in proc.stderr
    assert "Uvicorn running" not in proc.stderr
