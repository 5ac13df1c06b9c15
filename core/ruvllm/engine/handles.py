"""How results travel from the model thread to callers: async and sync request handles.

The model thread never touches an asyncio object directly. It calls :meth:`Sink.push` once per
step per request with the new outputs; the async sink hops onto the caller's event loop with
``call_soon_threadsafe``, the sync sink uses a thread-safe queue. No lock is shared with the
model thread, so a slow consumer can never stall a forward pass.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from ruvllm.types import GenerationResult, TokenOutput

_END = object()


class Sink(abc.ABC):
    @abc.abstractmethod
    def push(self, outputs: Sequence[TokenOutput], result: GenerationResult | None = None,
             error: BaseException | None = None) -> None:
        """Deliver outputs; ``result`` or ``error`` ends the request."""


class AsyncSink(Sink):
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.future: asyncio.Future[GenerationResult] = loop.create_future()
        # A result nobody awaits (a fire-and-forget stream) must not log "never retrieved".
        self.future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def push(self, outputs, result=None, error=None) -> None:
        with contextlib.suppress(RuntimeError):  # the caller's loop is closed: nobody listens
            self.loop.call_soon_threadsafe(self._on_loop, tuple(outputs), result, error)

    def _on_loop(self, outputs, result, error) -> None:
        for out in outputs:
            self.queue.put_nowait(out)
        if result is None and error is None:
            return
        self.queue.put_nowait(_END)
        if self.future.done():
            return
        if error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(result)


class RequestHandle:
    """One submitted request (implements :class:`ruvllm.serving.RequestHandle`).

    Iterate it for :class:`TokenOutput` items (once), await :meth:`result` for the final
    :class:`GenerationResult`; both raise the request's error (timeout, backend failure).
    """

    def __init__(self, request_id: str, sink: AsyncSink, cancel: Callable[[str], None]):
        self.request_id = request_id
        self._sink = sink
        self._cancel = cancel

    def __aiter__(self) -> AsyncIterator[TokenOutput]:
        return self._stream()

    async def _stream(self) -> AsyncIterator[TokenOutput]:
        while True:
            item = await self._sink.queue.get()
            if item is _END:
                if self._sink.future.done() and self._sink.future.exception() is not None:
                    raise self._sink.future.exception()  # type: ignore[misc]
                return
            yield item  # type: ignore[misc]

    async def result(self) -> GenerationResult:
        return await asyncio.shield(self._sink.future)

    def cancel(self) -> None:
        self._cancel(self.request_id)

    @property
    def done(self) -> bool:
        return self._sink.future.done()


class SyncSink(Sink):
    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[object] = queue.SimpleQueue()
        self.done = threading.Event()
        self.result: GenerationResult | None = None
        self.error: BaseException | None = None

    def push(self, outputs, result=None, error=None) -> None:
        for out in outputs:
            self.queue.put(out)
        if result is None and error is None:
            return
        self.result, self.error = result, error
        self.done.set()
        self.queue.put(_END)


class SyncRequestHandle:
    """The same handle for plain threads (scripts, tests, the CLI)."""

    def __init__(self, request_id: str, sink: SyncSink, cancel: Callable[[str], None]):
        self.request_id = request_id
        self._sink = sink
        self._cancel = cancel

    def __iter__(self) -> Iterator[TokenOutput]:
        while True:
            item = self._sink.queue.get()
            if item is _END:
                if self._sink.error is not None:
                    raise self._sink.error
                return
            yield item  # type: ignore[misc]

    def result(self, timeout: float | None = None) -> GenerationResult:
        if not self._sink.done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        if self._sink.error is not None:
            raise self._sink.error
        assert self._sink.result is not None
        return self._sink.result

    def cancel(self) -> None:
        self._cancel(self.request_id)
