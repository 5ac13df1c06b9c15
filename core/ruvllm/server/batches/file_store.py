"""The files of OpenAI's Files API (``/v1/files``): a batch's input uploaded, its output read back.

Files live on disk in a directory of the server's own (a temporary one, made by the first file and
removed when the server stops), so a 200 MiB batch input costs no memory; their records (OpenAI's
``file`` object) live in memory. They last as long as the server process, or less where
``expires_after`` says so: ruvllm keeps no state across restarts (docs/server.md).
"""

from __future__ import annotations

import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import attrs

from ruvllm.errors import InvalidRequest, StoredObjectNotFound

#: What a file may be for here: batch inputs (uploaded) and batch outputs (written by a batch).
#: OpenAI's other purposes (fine-tune, assistants, vision, evals) serve features ruvllm has not.
UPLOAD_PURPOSES = ("batch",)
OUTPUT_PURPOSE = "batch_output"


@attrs.define(kw_only=True)
class StoredFile:
    id: str
    filename: str
    purpose: str
    bytes: int
    created_at: int
    expires_at: int | None
    path: Path

    def card(self) -> dict[str, Any]:
        """OpenAI's ``file`` object."""
        return {"id": self.id, "object": "file", "bytes": self.bytes, "created_at": self.created_at,
                "expires_at": self.expires_at, "filename": self.filename, "purpose": self.purpose,
                "status": "processed", "status_details": None}


class FileStore:
    """The server's files, by id. Not thread-safe: the server's event loop is its only user."""

    def __init__(self, *, clock=time.time):
        # Made by the first file: most servers never store one, and a server killed before its
        # shutdown (or an app that never ran) then leaves no empty directory behind in /tmp.
        self._root: Path | None = None
        self._files: dict[str, StoredFile] = {}
        self._clock = clock

    def close(self) -> None:
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None
        self._files.clear()

    def _directory(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="ruvllm-files-"))
        return self._root

    def _new(self, filename: str, purpose: str, expires_after: int | None) -> StoredFile:
        file_id = f"file-{uuid.uuid4().hex}"
        now = int(self._clock())
        return StoredFile(id=file_id, filename=filename, purpose=purpose, bytes=0, created_at=now,
                          expires_at=None if expires_after is None else now + expires_after,
                          path=self._directory() / file_id)

    def upload(self, source: BinaryIO, *, filename: str, purpose: str,
               expires_after: int | None = None) -> StoredFile:
        """Copy an uploaded file in; ``purpose`` must be one this server uses."""
        if purpose not in UPLOAD_PURPOSES:
            raise InvalidRequest("purpose", f"{purpose!r} is for a feature ruvllm does not serve; upload "
                                 "batch inputs with purpose \"batch\"", purpose)
        stored = self._new(filename, purpose, expires_after)
        with stored.path.open("wb") as out:
            shutil.copyfileobj(source, out)
        stored.bytes = stored.path.stat().st_size
        self._files[stored.id] = stored
        return stored

    def write(self, data: bytes, *, filename: str, purpose: str = OUTPUT_PURPOSE,
              expires_after: int | None = None) -> StoredFile:
        """A file the server wrote (a batch's output or errors)."""
        stored = self._new(filename, purpose, expires_after)
        stored.path.write_bytes(data)
        stored.bytes = len(data)
        self._files[stored.id] = stored
        return stored

    def _expire(self) -> None:
        now = self._clock()
        for stored in [f for f in self._files.values() if f.expires_at is not None and f.expires_at <= now]:
            self.delete(stored.id)

    def get(self, file_id: str) -> StoredFile:
        self._expire()
        stored = self._files.get(file_id)
        if stored is None:
            raise StoredObjectNotFound("file", file_id, "GET /v1/files lists this server's files")
        return stored

    def content(self, file_id: str) -> bytes:
        return self.get(file_id).path.read_bytes()

    def delete(self, file_id: str) -> None:
        stored = self._files.pop(file_id, None)
        if stored is None:
            raise StoredObjectNotFound("file", file_id, "GET /v1/files lists this server's files")
        stored.path.unlink(missing_ok=True)

    def listing(self, *, purpose: str | None = None, newest_first: bool = True) -> Iterator[StoredFile]:
        self._expire()
        files = list(self._files.values())  # in upload order
        return (f for f in (reversed(files) if newest_first else files)
                if purpose is None or f.purpose == purpose)
