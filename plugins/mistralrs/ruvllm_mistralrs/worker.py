"""One thread that owns mistral.rs's ``Runner``.

The binding's ``Runner`` is a Rust object behind a borrow flag: two Python threads calling it at
once make all but one fail with ``RuntimeError('Already borrowed')``. So the Runner is created,
called and dropped on one dedicated thread; every other thread hands it work through a queue and
waits for the answer. The streams ``send_chat_completion_request`` returns are separate Rust
objects (channel receivers) that any thread may read, so callers consume their own stream
without holding up the Runner thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ruvllm.errors import BackendError

T = TypeVar("T")
_STOP = object()


class RunnerThread:
    """Creates the Runner with ``factory`` on its own thread and runs calls against it there."""

    def __init__(self, factory: Callable[[], Any], name: str = "mistralrs-runner"):
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._closed = False
        ready: Future[None] = Future()
        self._thread = threading.Thread(target=self._main, args=(factory, ready), name=name, daemon=True)
        self._thread.start()
        ready.result()  # re-raises the load error in the caller's thread

    def _main(self, factory: Callable[[], Any], ready: Future[None]) -> None:
        try:
            runner = factory()
        except BaseException as exc:  # the loader's error belongs to the caller
            ready.set_exception(exc)
            return
        ready.set_result(None)
        while True:
            item = self._queue.get()
            if item is _STOP:
                break
            fn, fut = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(runner))
            except BaseException as exc:
                fut.set_exception(exc)
        del runner  # dropped here, on its own thread

    def call(self, fn: Callable[[Any], T]) -> T:
        """Run ``fn(runner)`` on the Runner thread and return its result (or raise its error)."""
        if self._closed:
            raise BackendError("the mistralrs backend is closed")
        fut: Future[T] = Future()
        self._queue.put((fn, fut))
        return fut.result()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
