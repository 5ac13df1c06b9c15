"""One Serve replica: a real ServingEngine (its own model thread) behind Serve methods.

``generate`` is a streaming method: it yields :class:`~ruvllm.scaleout.wire.Accepted` once the
engine has queued the request, then lists of :class:`~ruvllm.types.TokenOutput` (everything
ready when the caller reads, so one engine step's tokens cross Ray in one message), then the
:class:`~ruvllm.types.GenerationResult`. Errors are yielded as values (``wire.WireError``). When
the caller cancels the stream (the HTTP client went away), Serve cancels this generator and the
engine request is cancelled, freeing its KV blocks. A constrained request carries its grammars'
recipes (``ReplicaRequest.grammars``); the replica rebuilds their processors with its engine's
own tokenizer and grammar engine (the ``guided_decoding_backend`` engine option, the same on
every replica and the ingress) and a replica-local compile cache, so a schema sent again is
compiled once per replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Sequence
from typing import Any

import attrs
import numpy as np

from ruvllm.config import Config
from ruvllm.errors import RuvllmError
from ruvllm.guided import GrammarCache, GrammarSpec, GuidedProcessor, guided_processor
from ruvllm.guided.request import grammar_engine_of
from ruvllm.scaleout.metrics_board import report_to_board, retire_on_board
from ruvllm.scaleout.wire import (
    Accepted,
    FeedbackCall,
    ReplicaDescription,
    ReplicaRequest,
    WireError,
    pack_error,
)
from ruvllm.serving import MetricsSnapshot


def _node_ip() -> str:
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (direct use in tests)
        return ""


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.to_full_id_str()
    except Exception:  # outside a Serve replica (direct use in tests)
        return f"local-{os.getpid()}"


class EngineReplica:
    """Serve deployment class (wrapped by ``serve.deployment`` in ``scaleout.app``)."""

    def __init__(self, config: Config, board_name: str | None = None):
        from ruvllm.engine import ServingEngine

        self._engine = ServingEngine.from_config(config)
        self._id = _replica_id()
        self._node_ip = _node_ip()
        self._feedback = 0
        self._board = board_name
        self._grammars = GrammarCache()
        self._reports: set[asyncio.Future] = set()  # pending reports, referenced until they run

    def __del__(self) -> None:
        """Serve calls this when it stops the replica: its gauges leave ``/metrics`` (the board
        retires it), then stop the model thread and free the model."""
        if getattr(self, "_board", None):
            retire_on_board(self._board, self._id)
        engine = getattr(self, "_engine", None)
        if engine is not None:
            engine.close()

    def describe(self) -> ReplicaDescription:
        e = self._engine
        return ReplicaDescription(info=e.info, capabilities=e.capabilities, backend_name=e.backend_name,
                                  path=e.path, policy=e.scheduling_policy,
                                  context_limit_note=e.context_limit_note, memory=e.memory_summary(),
                                  backend_choice=e.backend_choice,
                                  block_size=e.options.block_size, replica_id=self._id, pid=os.getpid())

    async def embed(self, inputs: Sequence[Sequence[int]]) -> Any:
        try:
            return np.asarray(await self._engine.embed_async(inputs))
        except RuvllmError as exc:
            return pack_error(exc)

    def metrics(self) -> MetricsSnapshot:
        return self._engine.metrics()

    def feedback(self, call: FeedbackCall) -> WireError | None:
        """The score, to this engine's learning plugin (which holds the requests this replica
        served); a ``FeedbackNotFound`` comes back naming this replica and its node. Counted and
        reported, so ``/ray/replicas`` shows where feedback went."""
        self._feedback += 1
        self._report()
        try:
            self._engine.feedback(call.request_id, call.score)
        except RuvllmError as exc:
            err = pack_error(exc)
            return attrs.evolve(err, message=f"{err.message} (replica {self._id} on node "
                                             f"{self._node_ip or 'unknown'})")
        return None

    async def _processors(self, grammars: tuple[GrammarSpec, ...]) -> list[GuidedProcessor]:
        """Fresh processors for the request's grammar recipes (compiles off the event loop on a
        cache miss)."""
        if not grammars:
            return []
        engine, grammar_engine = self._engine, grammar_engine_of(self._engine)
        return await asyncio.to_thread(lambda: [
            guided_processor(spec, engine.tokenizer, cache=self._grammars, engine=grammar_engine)
            for spec in grammars])

    async def generate(self, request: ReplicaRequest) -> AsyncIterator[object]:
        try:
            processors = await self._processors(request.grammars)
            handle = await self._engine.submit(
                request.prompt_ids, request.params, request_id=request.request_id,
                priority=request.priority, timeout=request.timeout, cache_salt=request.cache_salt,
                logits_processors=processors, prediction=request.prediction)
        except RuvllmError as exc:
            yield pack_error(exc)
            return
        yield Accepted(self._id, os.getpid())
        queue: asyncio.Queue[object] = asyncio.Queue()
        done = object()

        async def pump() -> None:
            try:
                async for out in handle:
                    queue.put_nowait(out)
                queue.put_nowait(await handle.result())
            except BaseException as exc:
                queue.put_nowait(pack_error(exc))
            finally:
                queue.put_nowait(done)

        task = asyncio.ensure_future(pump())
        finished = False
        try:
            while True:
                batch = [await queue.get()]
                while not queue.empty():
                    batch.append(queue.get_nowait())
                finished = batch[-1] is done
                outputs = [b for b in batch if b is not done]
                if outputs:
                    yield outputs
                if finished:
                    break
        finally:
            if not finished:  # cancelled by the caller: stop the engine request, free its KV
                handle.cancel()
                task.cancel()
                report = asyncio.ensure_future(self._report_when_done(handle))
                self._reports.add(report)
                report.add_done_callback(self._reports.discard)
            else:
                self._report()

    def _report(self) -> None:
        if self._board:
            report_to_board(self._board, self._id, os.getpid(), self._engine.metrics(), self._node_ip,
                            self._feedback)

    async def _report_when_done(self, handle: Any) -> None:
        """Report a cancelled request once the engine has counted it (on its model thread, a
        step later): reported at once, the board would miss the cancel until this replica
        finishes another request."""
        with contextlib.suppress(Exception):
            await asyncio.wait_for(handle.result(), timeout=10)
        self._report()
