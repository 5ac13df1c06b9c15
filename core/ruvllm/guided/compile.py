"""Grammar compilation: once per (engine, grammar, tokenizer), with a time limit, cached.

Compiling binds a grammar to the whole vocabulary (llguidance: ~2-3 ms for a typical schema at
49k tokens; xgrammar, which precomputes its masks: ~1 ms to ~1.5 s depending on the strings
and regexes in it; far more for a pathological one). The compiled template is kept and each
request gets a fresh matcher from it, so a schema sent again and again (the usual case: one
schema per application) is compiled once. The key is (engine, language, source text, the
engine's vocabulary object): the same schema under the two engines is two entries. Compilation
runs on a worker thread (both engines drop the GIL) and is abandoned after ``timeout`` seconds
with a 400 naming the field, so that one hostile schema cannot stall the server.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Any

from ruvllm.errors import InvalidRequest
from ruvllm.guided.engine import DEFAULT_ENGINE, GrammarEngine, GuidedMatcher, get_engine
from ruvllm.guided.grammar import GrammarSpec
from ruvllm.tokenizer import Tokenizer

#: Default limit on one grammar's compilation (seconds), whichever the engine.
COMPILE_TIMEOUT = 10.0

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
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="ruvllm-grammar")
        self.hits = 0
        self.misses = 0

    def matcher(self, spec: GrammarSpec, tokenizer: Tokenizer,
                engine: GrammarEngine | str = DEFAULT_ENGINE) -> GuidedMatcher:
        """A fresh matcher of ``engine`` for ``spec`` (InvalidRequest when it cannot compile or
        takes longer than the time limit). Blocking: call it off the event loop."""
        eng = get_engine(engine) if isinstance(engine, str) else engine
        vocabulary = eng.vocabulary(tokenizer)
        key = (eng.name, spec.language, spec.source, id(vocabulary))
        with self._lock:
            entry = self._templates.get(key)
            if entry is not None:
                self._templates.move_to_end(key)
                self.hits += 1
        if entry is not None:
            template = entry[1]
        else:
            template = self._compile(eng, spec, vocabulary)
            with self._lock:
                self.misses += 1
                self._templates[key] = (vocabulary, template)
                while len(self._templates) > self.max_entries:
                    self._templates.popitem(last=False)
        return eng.new_matcher(template)

    def _compile(self, engine: GrammarEngine, spec: GrammarSpec, vocabulary: Any) -> Any:
        future = self._pool.submit(engine.compile, spec, vocabulary)
        try:
            return future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            raise InvalidRequest(spec.field, f"the {spec.kind} grammar did not compile within "
                                 f"{self.timeout:g} s ({engine.name}); simplify it") from None


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
