"""Grammar compilation: validated once, with a time limit, cached by (grammar, tokenizer).

Building a matcher compiles the grammar's lexer against the whole vocabulary (~2-3 ms for a
typical schema at 49k tokens, far more for a pathological one). A compiled matcher is kept as a
template and each request gets a ``deep_copy`` (~50 us), so a schema sent again and again (the
usual case: one schema per application) is compiled once. Compilation runs on a worker thread
(llguidance drops the GIL) and is abandoned after ``timeout`` seconds with a 400 naming the
field, so that one hostile schema cannot stall the server.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from typing import Any

from ruvllm.errors import InvalidRequest
from ruvllm.guided.grammar import GrammarSpec
from ruvllm.guided.tokenizer import ll_tokenizer
from ruvllm.tokenizer import Tokenizer

#: Default limit on one grammar's compilation (seconds).
COMPILE_TIMEOUT = 10.0


def parser_limits() -> Any:
    """llguidance's resource limits; its defaults, with short errors (no grammar dumps)."""
    import llguidance

    return llguidance.LLParserLimits(verbose_errors=False)


class GrammarCache:
    """Compiled matcher templates, least recently used evicted beyond ``max_entries``."""

    def __init__(self, max_entries: int = 256, timeout: float = COMPILE_TIMEOUT):
        self.max_entries = max_entries
        self.timeout = timeout
        # Values keep their LLTokenizer alive, so the id() in a key is never reused meanwhile.
        self._templates: collections.OrderedDict[tuple[str, int], tuple[Any, Any]] = \
            collections.OrderedDict()
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="ruvllm-grammar")
        self.hits = 0
        self.misses = 0

    def matcher(self, spec: GrammarSpec, tokenizer: Tokenizer) -> Any:
        """A fresh ``llguidance.LLMatcher`` for ``spec`` (InvalidRequest when it cannot compile
        or takes longer than the time limit). Blocking: call it off the event loop."""
        llt = ll_tokenizer(tokenizer)
        key = (spec.grammar, id(llt))
        with self._lock:
            entry = self._templates.get(key)
            if entry is not None:
                self._templates.move_to_end(key)
                self.hits += 1
        if entry is not None:
            template = entry[1]
        else:
            template = self._compile(spec, llt)
            with self._lock:
                self.misses += 1
                self._templates[key] = (llt, template)
                while len(self._templates) > self.max_entries:
                    self._templates.popitem(last=False)
        return template.deep_copy()

    def _compile(self, spec: GrammarSpec, llt: Any) -> Any:
        import llguidance

        future = self._pool.submit(llguidance.LLMatcher, llt, spec.grammar, log_level=0,
                                   limits=parser_limits())
        try:
            matcher = future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            raise InvalidRequest(spec.field, f"the {spec.kind} grammar did not compile within "
                                 f"{self.timeout:g} s; simplify it") from None
        if matcher.is_error():
            raise InvalidRequest(spec.field, f"the {spec.kind} grammar cannot be used: "
                                 f"{_first_lines(matcher.get_error())}")
        return matcher


def _first_lines(message: str, n: int = 3) -> str:
    return " ".join(line.strip() for line in message.strip().splitlines()[:n])


_default: GrammarCache | None = None
_default_lock = threading.Lock()


def default_cache() -> GrammarCache:
    """The process's grammar cache (shared by every engine: keys include the tokenizer)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = GrammarCache()
        return _default
