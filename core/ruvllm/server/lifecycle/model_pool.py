"""The server's one place that turns a request's ``model`` into an engine (and a LoRA adapter).

Each served model is a :class:`ModelEntry`: a name, the names it also answers to, a loader that
builds an :class:`~ruvllm.serving.AsyncEngine` (a ServingEngine, or any other implementation,
such as a proxy to engines elsewhere) and the adapters that belong to it. The pool depends on the
AsyncEngine protocol only, never on one implementation's internals.

Entries load on first use (or at start with ``preload``), on a worker thread so the event loop
keeps serving the other models. A request that arrives while its model loads waits up to
``load_wait`` seconds, then gets 503 with ``Retry-After`` (:class:`~ruvllm.errors.Overloaded`):
a client that retries is served once the model is up, and nothing crashes. An entry with a
``keep_alive`` is unloaded once it has been idle that long (no request in a handler, none running
or waiting in its engine). A request may set its model's keep_alive, as Ollama's ``keep_alive``
does: it holds from that request on (``0``: unload once idle; None: never), and a request that
says nothing puts the configured one back. A model handed in already loaded, with no way to load
it again, is never unloaded, and a request asking for that is refused. With a ``memory_budget``,
loading a model that would pass it first unloads idle models, least recently used first; when
every loaded model is busy the request gets 503 rather than an out-of-memory process.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping

import attrs

from ruvllm.errors import InvalidRequest, ModelNotFound, Overloaded
from ruvllm.guided.tools import tool_format
from ruvllm.server.lifecycle.adapter_control import adapter_control
from ruvllm.serving import AsyncEngine

log = logging.getLogger(__name__)

#: Builds a loaded engine; blocking (it runs on a worker thread).
EngineLoader = Callable[[], AsyncEngine]


class ModelState(str, enum.Enum):
    UNLOADED = "unloaded"
    LOADING = "loading"
    LOADED = "loaded"
    FAILED = "failed"


@attrs.frozen(kw_only=True)
class ModelSpec:
    """What the operator configured for one served model."""

    name: str
    loader: EngineLoader
    #: Other names requests may use for it.
    aliases: tuple[str, ...] = ()
    #: Seconds idle before it is unloaded; None keeps it loaded.
    keep_alive: float | None = None
    #: Load when the server starts rather than on first use.
    preload: bool = False
    #: Bytes it is expected to take (for ``memory_budget``); called on the loading thread.
    memory_estimate: Callable[[], int] | None = None
    #: LoRA adapters loaded with it: name -> PEFT directory.
    adapters: Mapping[str, str] = attrs.field(factory=dict)
    #: What ``/v1/models`` shows as its root (the model reference); the loaded path once known.
    reference: str | None = None
    #: Whether ``loader`` can load it again after an unload (an engine handed in already loaded
    #: cannot be: such a model is never unloaded).
    reloadable: bool = True


class KeepAlive(enum.Enum):
    """A request that says nothing about keep_alive: its model's configured one applies."""

    CONFIGURED = "configured"


@attrs.define(eq=False)
class ModelEntry:
    """One served model and its lifecycle (only the pool changes it, on the event loop)."""

    spec: ModelSpec
    state: ModelState = ModelState.UNLOADED
    engine: AsyncEngine | None = None
    error: BaseException | None = None
    #: Requests inside a handler right now.
    leases: int = 0
    last_used: float = 0.0
    memory: int = 0
    #: Adapters on the loaded engine now: name -> path (configured ones, then runtime ones).
    adapters: dict[str, str] = attrs.field(factory=dict)
    task: asyncio.Task | None = None
    #: Seconds idle before it is unloaded (None: never): the last request's, else the configured.
    keep_alive: float | None = attrs.field(
        default=attrs.Factory(lambda self: self.spec.keep_alive, takes_self=True))

    @property
    def name(self) -> str:
        return self.spec.name


@attrs.frozen
class Route:
    """Where one request goes: the engine, the adapter (None: the base model), and the name
    responses carry (the adapter's name for an adapter, as vLLM does)."""

    engine: AsyncEngine
    adapter: str | None
    served_name: str
    entry: str


@attrs.frozen
class ServedModel:
    """A name the pool answers to, in no API's shape: a model, or an adapter on its model (which
    app.py lists at ``/v1/models`` in the shape OpenAI's and Anthropic's SDKs both read)."""

    name: str
    #: Where it comes from: the model's path or reference, the adapter's path.
    root: str | None
    #: The model an adapter belongs to; None for a model.
    parent: str | None
    state: ModelState
    #: A loaded model's context (None while not loaded, and for an adapter).
    context_length: int | None = None
    backend: str | None = None
    tool_format: str | None = None
    #: Why a model failed to load.
    error: str | None = None


class ModelPool:
    """Served models by name; see the module docstring."""

    def __init__(self, specs: Iterable[ModelSpec], *, load_wait: float = 30.0,
                 memory_budget: int | None = None, clock: Callable[[], float] = time.monotonic,
                 shutdown_grace: float = 10.0):
        self.entries: dict[str, ModelEntry] = {}
        self._names: dict[str, ModelEntry] = {}
        for spec in specs:
            entry = ModelEntry(spec)
            self.entries[spec.name] = entry
            for name in (spec.name, *spec.aliases):
                self._claim(name, entry)
        if not self.entries:
            raise InvalidRequest("models", "the server needs at least one model")
        self.default = next(iter(self.entries.values()))
        #: Adapter name -> the entry it belongs to (configured ones known before their model loads).
        self._adapters: dict[str, ModelEntry] = {}
        for entry in self.entries.values():
            for adapter in entry.spec.adapters:
                self._claim_adapter(adapter, entry)
        self.load_wait = load_wait
        self.memory_budget = memory_budget
        #: Seconds :meth:`shutdown` waits for each engine to stop before the process may exit
        #: without it (SIGTERM during a backend call that cannot be interrupted).
        self.shutdown_grace = shutdown_grace
        self._clock = clock
        self._reaper: asyncio.Task | None = None
        #: Called with the entry after it loaded / before its engine shuts down (metrics).
        self.on_loaded: list[Callable[[ModelEntry], None]] = []
        self.on_unloading: list[Callable[[ModelEntry], None]] = []

    @classmethod
    def single(cls, engine: AsyncEngine, name: str, aliases: Iterable[str] = (), *,
               adapters: Mapping[str, str] | None = None,
               reload: Callable[[], AsyncEngine] | None = None) -> ModelPool:
        """A pool of one engine that is already loaded (plain ``ruvllm serve``); its ``adapters``
        are loaded by :meth:`start`. With ``reload`` a request's keep_alive may unload it (the next
        request loads it again), else it stays loaded."""
        pool = cls([ModelSpec(name=name, aliases=tuple(aliases), loader=reload or (lambda: engine),
                              adapters=dict(adapters or {}), reloadable=reload is not None)])
        entry = pool.default
        entry.engine, entry.state, entry.last_used = engine, ModelState.LOADED, pool._clock()
        return pool

    def _claim(self, name: str, entry: ModelEntry) -> None:
        other = self._names.get(name)
        if other is not None and other is not entry:
            raise InvalidRequest("models", f"the name {name!r} is used by two models ({other.name!r} and "
                                 f"{entry.name!r}); give each model its own name", name)
        self._names[name] = entry

    def _claim_adapter(self, adapter: str, entry: ModelEntry) -> None:
        if adapter in self._names:
            raise InvalidRequest("lora_name", f"{adapter!r} is already the name of a served model; pick "
                                 "another adapter name", adapter)
        owner = self._adapters.get(adapter)
        if owner is not None and owner is not entry:
            raise InvalidRequest("lora_name", f"adapter {adapter!r} already belongs to model "
                                 f"{owner.name!r}; adapter names are unique in one server", adapter)
        self._adapters[adapter] = entry

    # ------------------------------------------------------------------ names

    def entry_for(self, name: str | None) -> tuple[ModelEntry, str | None]:
        """The entry serving ``name`` and the adapter it names (None: the base model)."""
        if name is None:
            return self.default, None
        entry = self._names.get(name)
        if entry is not None:
            return entry, None
        entry = self._adapters.get(name)
        if entry is not None:
            return entry, name
        raise ModelNotFound(f"model {name!r} is not served here; this server serves "
                            f"{', '.join(repr(n) for n in self.served_names())} (see GET /v1/models)")

    def served_names(self) -> list[str]:
        """Every model and adapter name a request may use (aliases excluded)."""
        return [*self.entries, *self._adapters]

    def accepted_names(self) -> list[str]:
        return [*self._names, *self._adapters]

    def adapter_owner(self, adapter: str) -> ModelEntry | None:
        return self._adapters.get(adapter)

    def add_adapter(self, entry: ModelEntry, adapter: str, path: str) -> None:
        """Record an adapter loaded at runtime onto ``entry``'s engine."""
        self._claim_adapter(adapter, entry)
        entry.adapters[adapter] = path

    def remove_adapter(self, adapter: str) -> None:
        entry = self._adapters.get(adapter)
        if entry is not None and adapter not in entry.spec.adapters:
            del self._adapters[adapter]
        if entry is not None:
            entry.adapters.pop(adapter, None)

    # ------------------------------------------------------------------ requests

    @contextlib.asynccontextmanager
    async def route(self, name: str | None,
                    keep_alive: float | KeepAlive | None = KeepAlive.CONFIGURED) -> AsyncIterator[Route]:
        """The route of a request naming ``name``, held for the request's handler: its model is not
        unloaded meanwhile (the engine's own running count covers streams after the handler).
        ``keep_alive`` (seconds, None: never unload) holds for the model from this request on."""
        entry, adapter = self.entry_for(name)
        if keep_alive is not KeepAlive.CONFIGURED and keep_alive is not None and not entry.spec.reloadable:
            raise InvalidRequest("keep_alive", f"model {entry.name!r} was handed to this server already "
                                 "loaded and cannot be loaded again, so it is never unloaded; leave "
                                 "keep_alive out or make it negative (keep loaded)")
        # The lease is held while the model loads too: the reaper must not unload what this
        # request waits for (a keep_alive of 0 from an earlier request unloaded it between the
        # load finishing and this request resuming: a 500).
        entry.leases += 1
        served = False
        try:
            engine = await self.engine_of(entry)
            if adapter is not None and adapter not in entry.adapters:
                raise ModelNotFound(f"adapter {adapter!r} of model {entry.name!r} is not loaded (it was "
                                    "unloaded); load it again with POST /v1/load_lora_adapter")
            entry.last_used = self._clock()
            served = True
            yield Route(engine, adapter, adapter or entry.name, entry.name)
        finally:
            entry.leases -= 1
            if served:
                entry.last_used = self._clock()
                entry.keep_alive = entry.spec.keep_alive if keep_alive is KeepAlive.CONFIGURED else keep_alive

    async def engine_of(self, entry: ModelEntry) -> AsyncEngine:
        """``entry``'s engine, loading it if needed; 503 + Retry-After if it is not up within
        ``load_wait`` seconds, the load's own error if it failed."""
        deadline = asyncio.get_running_loop().time() + self.load_wait
        # A loop, not one wait: a caller without a lease (runtime LoRA loading) may find the
        # model unloaded again between the load finishing and this coroutine resuming.
        while entry.state is not ModelState.LOADED or entry.engine is None:
            task = self._start_load(entry)
            try:
                await asyncio.wait_for(asyncio.shield(task),
                                       timeout=max(0.0, deadline - asyncio.get_running_loop().time()))
            except asyncio.TimeoutError:
                raise Overloaded(f"model {entry.name!r} is loading; retry shortly (Retry-After)",
                                 retry_after=max(1.0, min(self.load_wait, 5.0))) from None
        return entry.engine

    def _start_load(self, entry: ModelEntry) -> asyncio.Task:
        if entry.task is None or entry.task.done():
            entry.state, entry.error = ModelState.LOADING, None
            entry.task = asyncio.ensure_future(self._load(entry))
            # A load nobody waits for any more (the client left) is still retrieved.
            entry.task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return entry.task

    async def _load(self, entry: ModelEntry) -> None:
        try:
            if self.memory_budget is not None:
                estimate = entry.spec.memory_estimate
                entry.memory = await asyncio.to_thread(estimate) if estimate is not None else 0
                await self._make_room(entry)
            engine = await asyncio.to_thread(entry.spec.loader)
            try:
                await self._load_adapters(entry, engine)
            except BaseException:
                await engine.shutdown()
                raise
        except BaseException as exc:
            # No room yet is not a failure of the model: it stays unloaded, to be tried again.
            entry.state = ModelState.UNLOADED if isinstance(exc, Overloaded) else ModelState.FAILED
            entry.error, entry.memory = exc, 0
            log.error("loading model %r failed: %s", entry.name, exc)
            raise
        entry.engine, entry.state, entry.last_used = engine, ModelState.LOADED, self._clock()
        log.info("model %r loaded on backend %s", entry.name, engine.backend_name)
        for hook in self.on_loaded:
            hook(entry)

    async def _load_adapters(self, entry: ModelEntry, engine: AsyncEngine) -> None:
        entry.adapters = {}
        if not entry.spec.adapters:
            return
        control = adapter_control(engine)
        for name, path in entry.spec.adapters.items():
            await control.load(name, path)
            entry.adapters[name] = path

    async def _make_room(self, loading: ModelEntry) -> None:
        """Unload idle models, least recently used first, until ``loading`` fits the budget."""
        budget = self.memory_budget
        assert budget is not None
        if loading.memory > budget:
            raise InvalidRequest("model", f"model {loading.name!r} needs about {loading.memory} bytes, more "
                                 f"than the whole memory budget ({budget} bytes); raise [server] "
                                 "memory_budget", loading.name)
        while self._used_memory(loading) + loading.memory > budget:
            idle = sorted((e for e in self.entries.values()
                           if e is not loading and e.state is ModelState.LOADED and self._idle(e)),
                          key=lambda e: e.last_used)
            if not idle:
                raise Overloaded(f"model {loading.name!r} does not fit the memory budget ({budget} bytes) "
                                 "while the loaded models are busy; retry shortly", retry_after=2.0)
            log.info("unloading model %r (least recently used) to make room for %r", idle[0].name,
                     loading.name)
            await self.unload(idle[0])

    def _used_memory(self, excluding: ModelEntry) -> int:
        return sum(e.memory for e in self.entries.values()
                   if e is not excluding and e.state in (ModelState.LOADED, ModelState.LOADING))

    def _idle(self, entry: ModelEntry) -> bool:
        if entry.leases or entry.engine is None:
            return False
        snap = entry.engine.metrics()
        return snap.running == 0 and snap.waiting == 0

    # ------------------------------------------------------------------ lifecycle

    async def unload(self, entry: ModelEntry, *, wait: float | None = None) -> None:
        """Shut ``entry``'s engine down; the next request loads it again. ``wait``: give up
        waiting for the engine to stop after that many seconds (it stops on its own later)."""
        engine = entry.engine
        if engine is None:
            return
        for hook in self.on_unloading:
            hook(entry)
        # First detach it, so no new request is routed to an engine that is shutting down.
        entry.engine, entry.state, entry.memory, entry.task = None, ModelState.UNLOADED, 0, None
        for adapter in list(entry.adapters):
            self.remove_adapter(adapter)
        try:
            await asyncio.wait_for(engine.shutdown(), wait)
        except TimeoutError:
            log.warning("model %r: its engine is still inside a backend call after %.1f s (a long "
                        "prefill cannot be interrupted); not waiting for it", entry.name, wait)
            return
        log.info("model %r unloaded", entry.name)

    async def reap(self) -> list[str]:
        """Unload every model idle for longer than its keep_alive; returns their names."""
        now = self._clock()
        done = []
        for entry in list(self.entries.values()):
            keep = entry.keep_alive
            if keep is None or entry.state is not ModelState.LOADED:
                continue
            if not self._idle(entry):
                entry.last_used = now  # still serving a stream: idle time starts when it ends
                continue
            if now - entry.last_used >= keep:
                await self.unload(entry)
                done.append(entry.name)
        return done

    def reap_interval(self) -> float:
        """A quarter of the shortest keep_alive (so an idle model goes within 25 % of it), between
        50 ms and 5 s: a request may set one at any time."""
        keeps = [e.keep_alive for e in self.entries.values() if e.keep_alive is not None]
        return min(max(min(keeps) / 4, 0.05), 5.0) if keeps else 5.0

    async def start(self) -> None:
        """Preload what asks for it and start the keep_alive reaper (the app's lifespan calls it)."""
        for entry in self.entries.values():
            if entry.state is ModelState.LOADED and entry.engine is not None and entry.spec.adapters:
                await self._load_adapters(entry, entry.engine)  # a failure stops the server's start
            elif entry.spec.preload and entry.state is not ModelState.LOADED:
                self._start_load(entry)
        self._reaper = asyncio.ensure_future(self._reap_periodically())

    async def _reap_periodically(self) -> None:
        while True:
            await asyncio.sleep(self.reap_interval())
            try:
                await self.reap()
            except Exception:  # one failed shutdown must not stop the others
                log.exception("unloading idle models failed")

    async def shutdown(self) -> None:
        if self._reaper is not None:
            self._reaper.cancel()
        for entry in self.entries.values():
            if entry.task is not None and not entry.task.done():
                with contextlib.suppress(BaseException):
                    await entry.task
            await self.unload(entry, wait=self.shutdown_grace)

    # ------------------------------------------------------------------ /v1/models

    def served(self) -> list[ServedModel]:
        """Every name served: each model with its state, then each adapter with its parent."""
        out = []
        for entry in self.entries.values():
            engine = entry.engine
            error = str(entry.error) if entry.state is ModelState.FAILED and entry.error is not None else None
            if engine is None:
                out.append(ServedModel(entry.name, entry.spec.reference or entry.name, None, entry.state,
                                       error=error))
                continue
            info = engine.info
            out.append(ServedModel(entry.name, info.path or entry.spec.reference or entry.name, None,
                                   entry.state, context_length=info.context_length,
                                   backend=engine.backend_name, tool_format=tool_format(info.chat_template),
                                   error=error))
        for adapter, entry in self._adapters.items():
            path = entry.adapters.get(adapter) or entry.spec.adapters.get(adapter)
            state = entry.state if adapter in entry.adapters or entry.engine is None else ModelState.UNLOADED
            out.append(ServedModel(adapter, path, entry.name, state))
        return out

    def served_one(self, name: str) -> ServedModel:
        """The model or adapter ``name`` picks (:class:`~ruvllm.errors.ModelNotFound` for another)."""
        entry, adapter = self.entry_for(name)
        wanted = adapter or entry.name
        return next(m for m in self.served() if m.name == wanted)
