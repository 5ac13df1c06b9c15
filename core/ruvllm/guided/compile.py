"""Grammar compilation: once per (engine, grammar, tokenizer), with a time limit, cached.

Compiling binds a grammar to the whole vocabulary (llguidance: ~2-3 ms for a typical schema at
49k tokens, ~2 s for 3000 properties each with an anyOf; xgrammar, which precomputes its masks:
~1 ms to ~1.5 s depending on the strings and regexes in it, 24 s for 40 long bounded strings).
The compiled template is kept and each request gets a fresh matcher from it, so a schema sent
again and again (the usual case: one schema per application) is compiled once. The key is
(engine, language, source text, the engine's vocabulary object): the same schema under the two
engines is two entries.

Neither library can stop a compile at a time limit (llguidance's ``LLParserLimits`` bound sizes
and lexer fuel, not time; xgrammar has no limit, mlc-ai/xgrammar#298), and a thread cannot be
stopped: a compile abandoned after its timeout used to keep one of the two compile threads busy,
so two hostile schemas stalled every later compile. Each compile therefore runs in a forked child
process (it inherits the engine's vocabulary, nothing is re-imported or rebuilt; ~15 ms for a
typical schema) that is killed at ``timeout`` seconds with :class:`~ruvllm.errors.GrammarCompileTimeout`
(a 400 naming the field). An engine with a portable form of a compiled grammar (xgrammar's JSON)
hands the child's result back; otherwise (llguidance, whose compile is lazy and cheap once shown to
finish) the parent compiles the grammar again after the child has shown it compiles in time. A
grammar the child failed to compile is compiled in the parent too, which raises the engine's own
typed error (a fast failure, as the child's was).
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import threading
from multiprocessing.connection import Connection
from typing import Any

from ruvllm.errors import GrammarCompileCrashed, GrammarCompileTimeout
from ruvllm.guided.engine import DEFAULT_ENGINE, GrammarEngine, GuidedMatcher, get_engine
from ruvllm.guided.fork_guard import forking, library_call
from ruvllm.guided.grammar import GrammarSpec
from ruvllm.tokenizer import Tokenizer

#: Default limit on one grammar's compilation (seconds), whichever the engine.
COMPILE_TIMEOUT = 10.0
#: Compiles running at once (each in its own child process); more wait for a slot, which every
#: compile frees within its time limit. Two: the cores are shared with the forward pass.
MAX_CONCURRENT_COMPILES = 2

CacheKey = tuple[str, str, str, int]


class GrammarCache:
    """Compiled templates, least recently used evicted beyond ``max_entries``."""

    def __init__(self, max_entries: int = 256, timeout: float = COMPILE_TIMEOUT):
        self.max_entries = max_entries
        self.timeout = timeout
        # Values keep the engine's vocabulary object alive, so the id() in a key is never reused
        # meanwhile.
        self._templates: collections.OrderedDict[CacheKey, tuple[Any, Any]] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(MAX_CONCURRENT_COMPILES)
        #: Keys being compiled -> the template (or the error) every waiting request gets.
        self._compiling: dict[CacheKey, concurrent.futures.Future[Any]] = {}
        self.hits = 0
        self.misses = 0

    def matcher(self, spec: GrammarSpec, tokenizer: Tokenizer,
                engine: GrammarEngine | str = DEFAULT_ENGINE) -> GuidedMatcher:
        """A fresh matcher of ``engine`` for ``spec`` (InvalidRequest when it cannot compile or
        takes longer than the time limit). Blocking: call it off the event loop."""
        eng = get_engine(engine) if isinstance(engine, str) else engine
        with library_call():
            vocabulary = eng.vocabulary(tokenizer)
        key = (eng.name, spec.language, spec.source, id(vocabulary))
        with self._lock:
            entry = self._templates.get(key)
            if entry is not None:
                self._templates.move_to_end(key)
                self.hits += 1
                return _new_matcher(eng, entry[1])
            pending = self._compiling.get(key)
            owner = pending is None
            if owner:
                pending = self._compiling[key] = concurrent.futures.Future()
        if not owner:
            # The same grammar is being compiled for another request: wait for that one compile
            # (20 requests with one schema used to start 20 compiles and time out together).
            template = pending.result()
            with self._lock:
                self.hits += 1
            return _new_matcher(eng, template)
        try:
            template = self._compile(eng, spec, vocabulary)
        except BaseException as exc:
            with self._lock:
                del self._compiling[key]
            pending.set_exception(exc)
            raise
        with self._lock:
            del self._compiling[key]
            self.misses += 1
            self._templates[key] = (vocabulary, template)
            while len(self._templates) > self.max_entries:
                self._templates.popitem(last=False)
        pending.set_result(template)
        return _new_matcher(eng, template)

    def _compile(self, engine: GrammarEngine, spec: GrammarSpec, vocabulary: Any) -> Any:
        with self._slots:
            compiled, data = compile_in_child(engine, spec, vocabulary, self.timeout)
        with library_call():
            if compiled and data is not None:
                return engine.from_portable(data, vocabulary)
            # Shown to compile in time (no portable form), or failed in the child: compiling here
            # gives the template, or raises the engine's own typed error.
            return engine.compile(spec, vocabulary)


def _new_matcher(engine: GrammarEngine, template: Any) -> GuidedMatcher:
    with library_call():
        return engine.new_matcher(template)


def _compile_child(conn: Connection, engine: GrammarEngine, spec: GrammarSpec, vocabulary: Any) -> None:
    """The forked child's work: ``(True, portable form or None)`` once compiled, ``(False, None)``
    when the compile raised (the parent reproduces the error with its type)."""
    try:
        data = engine.portable(engine.compile(spec, vocabulary))
    except BaseException:
        conn.send((False, None))
    else:
        conn.send((True, data))
    conn.close()


def compile_in_child(engine: GrammarEngine, spec: GrammarSpec, vocabulary: Any,
                     timeout: float) -> tuple[bool, Any]:
    """Compile ``spec`` in a forked child process, killed after ``timeout`` seconds.

    Returns ``(compiled, portable form)`` (see :func:`_compile_child`). Raises
    :class:`~ruvllm.errors.GrammarCompileTimeout` at the limit and
    :class:`~ruvllm.errors.GrammarCompileCrashed` when the child dies without answering; in
    every case the child is gone when this returns. Fork, not spawn: the child needs the engine's
    vocabulary (built from the model's tokenizer, not picklable) and must not import the engine
    library again (xgrammar: ~5 s)."""
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_compile_child, args=(send, engine, spec, vocabulary),
                        name="ruvllm-grammar-compile", daemon=True)
    with forking():
        child.start()
    send.close()
    try:
        if not receive.poll(timeout):
            raise GrammarCompileTimeout(spec.field, spec.kind, engine.name, timeout)
        try:
            return receive.recv()
        except EOFError:  # the child died before answering
            child.join()
            raise GrammarCompileCrashed(spec.field, spec.kind, engine.name, child.exitcode) from None
    finally:
        if child.is_alive():
            child.kill()
        child.join()
        receive.close()


_default: GrammarCache | None = None
_default_lock = threading.Lock()


def default_cache() -> GrammarCache:
    """The process's grammar cache (shared by every engine: keys include the engine and the
    tokenizer)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = GrammarCache()
        return _default
