"""A local stand-in for the Hugging Face Hub's HTTP API, so download tests never touch the network.

It serves, on 127.0.0.1 and an ephemeral port, the endpoints ``huggingface_hub`` uses to
download (checked against huggingface_hub 2.4's ``file_download.py``/``_snapshot_download.py``):

- ``HEAD``/``GET /{repo}/resolve/{revision}/{filename}``: the file, with ``X-Repo-Commit``,
  ``ETag`` (git blob sha1; sha256 for LFS-like ``.gguf``/``.safetensors``/``.bin`` files) and
  ``Content-Length``; ``Range: bytes=N-`` gives ``206`` so resumed downloads work;
- ``GET /api/models/{repo}/revision/{revision}``: repo info JSON with ``sha`` and ``siblings``;
- ``GET /api/models/{repo}/tree/{revision}[/{path}]``: the file listing ``snapshot_download``
  reads (``type``, ``path``, ``size``, ``oid``, ``lfs``);
- errors as the Hub sends them: unknown repo -> 401 ``X-Error-Code: RepoNotFound``; unknown
  revision -> 404 ``RevisionNotFound``; unknown file -> 404 ``EntryNotFound``.

Every request is logged in :attr:`HubFixture.requests` as ``(method, path)``, so a test can
assert that a cached or offline lookup made no request at all.

In-process use (pytest)::

    from hub_fixture import HubFixture      # see "Importing it" below

    def test_download(tmp_path):
        with HubFixture() as hub, hub.patched():
            hub.add_repo("acme/tiny-GGUF", {"tiny.gguf": b"GGUF" + bytes(60)})
            path = ruvllm.registry.fetch("acme/tiny-GGUF", "tiny.gguf", tmp_path)

``patched()`` points an already-imported ``huggingface_hub`` at the fixture by setting
``huggingface_hub.constants.ENDPOINT`` and ``HUGGINGFACE_CO_URL_TEMPLATE`` (both are read at
call time; ``HF_ENDPOINT`` itself is read only when ``huggingface_hub.constants`` is first
imported) and restores them on exit. It also sets ``HF_ENDPOINT`` in ``os.environ`` for the
duration, so child processes started inside the block inherit it.

Subprocess use (CLI tests): start the fixture in the test process and run the CLI with
``env={**os.environ, **hub.env()}``; ``env()`` gives ``HF_ENDPOINT`` (read by the child's
``huggingface_hub`` at import) plus settings that keep the child quiet and offline-safe.

Standalone, for trying the CLI by hand::

    python tests/core/hub_fixture.py acme/tiny-GGUF=path/to/tiny.gguf acme/tiny-hf=path/to/dir
    # prints HF_ENDPOINT=http://127.0.0.1:PORT and serves until interrupted

Importing it from another test directory (``tests/core`` has no ``__init__.py``)::

    import sys; from pathlib import Path
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "core"))
    from hub_fixture import HubFixture
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

#: Files the Hub stores through LFS: their ETag is the sha256 of the content.
_LFS_SUFFIXES = (".gguf", ".safetensors", ".bin", ".pt")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_API_REVISION = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/revision/(?P<rev>[^/]+)$")
_API_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<path>.*))?$")


def git_blob_sha1(data: bytes) -> str:
    """The object id git (and so the Hub) gives a file's content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class FakeRepo:
    """One model repository: its files at a single commit."""

    def __init__(self, repo_id: str, files: Mapping[str, bytes], commit: str):
        self.repo_id = repo_id
        self.files = dict(files)
        self.commit = commit

    def etag(self, name: str) -> str:
        data = self.files[name]
        if self.is_lfs(name):
            return hashlib.sha256(data).hexdigest()
        return git_blob_sha1(data)

    @staticmethod
    def is_lfs(name: str) -> bool:
        return name.endswith(_LFS_SUFFIXES)

    def tree_entry(self, name: str) -> dict:
        data = self.files[name]
        entry = {"type": "file", "path": name, "size": len(data), "oid": git_blob_sha1(data)}
        if self.is_lfs(name):
            entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
        return entry

    def info(self) -> dict:
        return {
            "_id": hashlib.md5(self.repo_id.encode()).hexdigest()[:24],
            "id": self.repo_id,
            "modelId": self.repo_id,
            "author": self.repo_id.split("/")[0],
            "sha": self.commit,
            "private": False,
            "disabled": False,
            "gated": False,
            "tags": [],
            "siblings": [{"rfilename": name} for name in sorted(self.files)],
        }


class HubFixture:
    """A running fake Hub; use as a context manager (starts on enter, stops on exit)."""

    def __init__(self) -> None:
        self.repos: dict[str, FakeRepo] = {}
        self.requests: list[tuple[str, str]] = []
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- content -------------------------------------------------------------------------
    def add_repo(self, repo_id: str, files: Mapping[str, bytes] | str | Path) -> FakeRepo:
        """Publish ``files`` (name -> bytes, or a file or directory on disk) as ``repo_id``."""
        if isinstance(files, (str, Path)):
            files = _read_files(Path(files))
        commit = hashlib.sha1(repr((repo_id, sorted(files.items()))).encode()).hexdigest()
        repo = FakeRepo(repo_id, files, commit)
        with self._lock:
            self.repos[repo_id] = repo
        return repo

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def url(self) -> str:
        assert self._server is not None, "the fixture is not running; use it in a with block"
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> HubFixture:
        handler = type("Handler", (_Handler,), {"hub": self})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="hub-fixture", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> HubFixture:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- pointing huggingface_hub at it -----------------------------------------------------
    def env(self) -> dict[str, str]:
        """Environment for a child process whose huggingface_hub should use this fixture."""
        return {
            "HF_ENDPOINT": self.url,
            "HF_HUB_DISABLE_TELEMETRY": "1",
            "HF_HUB_DISABLE_PROGRESS_BARS": "1",
            "HF_HUB_DISABLE_XET": "1",
            "HF_HUB_OFFLINE": "0",
        }

    @contextlib.contextmanager
    def patched(self) -> Iterator[HubFixture]:
        """Point this process's huggingface_hub at the fixture for the duration of the block."""
        from huggingface_hub import constants

        saved = (constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE, os.environ.get("HF_ENDPOINT"),
                 constants.HF_HUB_OFFLINE)
        # huggingface_hub reads HF_HUB_OFFLINE once, at import: a test that imported it (through
        # lm_eval or datasets) while offline would otherwise leave this process offline for good.
        constants.HF_HUB_OFFLINE = False
        constants.ENDPOINT = self.url
        constants.HUGGINGFACE_CO_URL_TEMPLATE = self.url + "/{repo_id}/resolve/{revision}/{filename}"
        os.environ["HF_ENDPOINT"] = self.url
        try:
            yield self
        finally:
            constants.ENDPOINT, constants.HUGGINGFACE_CO_URL_TEMPLATE = saved[0], saved[1]
            constants.HF_HUB_OFFLINE = saved[3]
            if saved[2] is None:
                os.environ.pop("HF_ENDPOINT", None)
            else:
                os.environ["HF_ENDPOINT"] = saved[2]

    def _log(self, method: str, path: str) -> None:
        with self._lock:
            self.requests.append((method, path))


def _read_files(root: Path) -> dict[str, bytes]:
    if root.is_file():
        return {root.name: root.read_bytes()}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


class _Handler(BaseHTTPRequestHandler):
    hub: HubFixture
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # keep test output clean
        return

    def do_HEAD(self) -> None:
        self._dispatch(head=True)

    def do_GET(self) -> None:
        self._dispatch(head=False)

    # -- routing -------------------------------------------------------------------------
    def _dispatch(self, *, head: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        self.hub._log(self.command, path)
        if m := _RESOLVE.match(path):
            return self._resolve(m["repo"], m["rev"], m["file"], head=head)
        if m := _API_REVISION.match(path):
            repo = self._repo_at(m["repo"], m["rev"])
            if repo is not None:
                self._json(repo.info(), head=head)
            return None
        if m := _API_TREE.match(path):
            repo = self._repo_at(m["repo"], m["rev"])
            if repo is not None:
                prefix = (m["path"] or "").strip("/")
                names = [n for n in sorted(repo.files) if not prefix or n.startswith(prefix + "/")]
                self._json([repo.tree_entry(n) for n in names], head=head)
            return None
        return self._error(404, None, "Not Found")

    def _repo_at(self, repo_id: str, revision: str) -> FakeRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if revision not in ("main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            return None
        return repo

    def _resolve(self, repo_id: str, revision: str, name: str, *, head: bool) -> None:
        repo = self._repo_at(repo_id, revision)
        if repo is None:
            return
        if name not in repo.files:
            self._error(404, "EntryNotFound", "Entry not found", commit=repo.commit)
            return
        data = repo.files[name]
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and (m := re.fullmatch(r"bytes=(\d+)-", rng.strip())) and not head:
            start, status = min(int(m[1]), len(data)), 206
        body = data[start:]
        self.send_response(status)
        self.send_header("X-Repo-Commit", repo.commit)
        self.send_header("ETag", f'"{repo.etag(name)}"')
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        self.end_headers()
        if not head:
            self.wfile.write(body)

    # -- responses -----------------------------------------------------------------------
    def _json(self, payload: object, *, head: bool) -> None:
        body = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if not head:
            self.wfile.write(body)

    def _error(self, status: int, code: str | None, message: str, commit: str | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        self.send_response(status)
        if code is not None:
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
        if commit is not None:
            self.send_header("X-Repo-Commit", commit)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)


def main(argv: list[str]) -> int:
    """Serve ``owner/repo=PATH`` pairs until interrupted (manual testing of the CLI)."""
    if not argv or any("=" not in a for a in argv):
        print(__doc__.split("Standalone")[1].split("Importing")[0], file=sys.stderr)
        return 2
    with HubFixture() as hub:
        for pair in argv:
            repo_id, _, path = pair.partition("=")
            hub.add_repo(repo_id, Path(path))
        print(f"HF_ENDPOINT={hub.url}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
