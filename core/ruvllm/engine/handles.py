"""How results travel from the model thread to callers: async and sync request handles.

The model thread never touches an asyncio object directly. It calls :meth:`Sink.push` once per
step per request with the new outputs; the async sink hops onto the caller's event loop with
``call_soon_threadsafe``, the sync sink uses a thread-safe queue. A slow consumer can never
stall a forward pass: the only lock the model thread takes (a loop's mailbox) guards a list
append.

Hand-offs to one event loop are coalesced: all the outputs a step produces for the requests of
one loop travel in ONE ``call_soon_threadsafe`` (one self-pipe write, one wake-up of the loop's
thread) instead of one per request. At 16 concurrent requests that was 16 socket writes and
wake-ups per step, and every wake-up of the caller's thread competes for the CPU cores with
llama.cpp's threads.
"""

from __future__ import annotations

import abc
import asyncio
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from ruvllm.types import GenerationResult, TokenOutput

_END = object()


class Sink(abc.ABC):
    @abc.abstractmethod
    def push(self, outputs: Sequence[TokenOutput], result: GenerationResult | None = None,
             error: BaseException | None = None) -> None:
        """Deliver outputs; ``result`` or ``error`` ends the request."""


class _LoopMailbox:
    """Deliveries waiting for one event loop; at most one drain is scheduled at a time."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._lock = threading.Lock()
        self._items: list[tuple[Callable[..., None], tuple]] = []

    def post(self, fn: Callable[..., None], *args: object) -> None:
        with self._lock:
            self._items.append((fn, args))
            if len(self._items) > 1:
                return  # a drain is already scheduled and will deliver this one too
        try:
            self.loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: nobody listens
            with self._lock:
                self._items.clear()

    def _drain(self) -> None:
        with self._lock:
            items, self._items = self._items, []
        for fn, args in items:
            try:
                fn(*args)
            except Exception as exc:  # one broken delivery must not lose the others
                self.loop.call_exception_handler({"message": "ruvllm output delivery failed",
                                                  "exception": exc})


_mailboxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopMailbox] = weakref.WeakKeyDictionary()
_mailboxes_lock = threading.Lock()


def _mailbox(loop: asyncio.AbstractEventLoop) -> _LoopMailbox:
    with _mailboxes_lock:
        box = _mailboxes.get(loop)
        if box is None:
            box = _mailboxes[loop] = _LoopMailbox(loop)
        return box


class AsyncSink(Sink):
    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self._box = _mailbox(loop)
        self.queue: asyncio.Queue[object] = asyncio.Queue()
        self.future: asyncio.Future[GenerationResult] = loop.create_future()
        # A result nobody awaits (a fire-and-forget stream) must not log "never retrieved".
        self.future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def push(self, outputs, result=None, error=None) -> None:
        self._box.post(self._on_loop, tuple(outputs), result, error)

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
