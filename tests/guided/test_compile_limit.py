"""A grammar compile stops at its time limit: hostile grammars are refused with a typed error, their
compiles are killed (nothing keeps running), and a normal compile right after is not delayed.

Before, the compile ran on one of two pool threads and was only abandoned at the limit: two
hostile grammars kept both threads busy, so every later compile waited for them (or timed out).
The hostile grammars here are real ones, measured on the embedded SmolLM2's 49k vocabulary: a Lark
grammar of 30000 alternatives takes llguidance ~2.5 s, a JSON schema of 40 long bounded strings
takes xgrammar ~24 s.
"""

from __future__ import annotations

import importlib.util
import multiprocessing
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
from ruvllm.config import default_cache_dir
from ruvllm.errors import GrammarCompileCrashed, GrammarCompileTimeout, InvalidRequest
from ruvllm.guided import GrammarCache, from_extensions, json_schema_grammar
from ruvllm.guided.engine import GrammarEngine, get_engine
from ruvllm.guided.fork_guard import library_call
from ruvllm.guided.processor import mask_words
from ruvllm.registry import resolve
from server_helpers import _require_backend

LIMIT = 0.5
#: A normal compile after the hostile ones: fork + a few ms of compiling, on a busy 2-core machine.
PROMPT = 1.5


@pytest.fixture(scope="module")
def tokenizer():
    _require_backend("llamacpp")
    import ruvllm_llamacpp

    backend = ruvllm_llamacpp.LlamaCppBackend.load(resolve("default", default_cache_dir()),
                                                   {"n_ctx": 256, "n_threads": 1})
    yield backend.tokenizer
    backend.close()


def hostile(engine: str, variant: int):
    if engine == "llguidance":
        alternatives = " | ".join(f'"w{i}" /[a-z]{{1,{i % 50 + 1}}}/' for i in range(30000 + variant))
        return from_extensions(guided_grammar="start: " + alternatives)
    n = 40 + variant
    return json_schema_grammar("guided_json", {
        "type": "object", "required": [f"k{i}" for i in range(n)],
        "properties": {f"k{i}": {"type": "string", "maxLength": 1000 + i} for i in range(n)}})


NORMAL = json_schema_grammar("guided_json", {"type": "object", "required": ["a"],
                                             "properties": {"a": {"type": "integer"}}})


def compile_children() -> list:
    return [p for p in multiprocessing.active_children() if p.name == "ruvllm-grammar-compile"]


@pytest.mark.parametrize("engine", ["llguidance", "xgrammar"])
def test_hostile_grammars_stop_at_the_limit_and_later_compiles_are_prompt(tokenizer, engine):
    if engine == "xgrammar" and importlib.util.find_spec("xgrammar") is None:
        pytest.skip("xgrammar is not installed (see docs/structured-output.md)")
    eng = get_engine(engine)
    eng.vocabulary(tokenizer)  # built once per tokenizer (~0.4 s), not part of any compile
    cache = GrammarCache(timeout=LIMIT)
    specs = [hostile(engine, v) for v in range(2)]  # as many as compiles run at once
    started = time.perf_counter()
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = [pool.submit(cache.matcher, spec, tokenizer, eng) for spec in specs]
        for spec, future in zip(specs, futures, strict=True):
            with pytest.raises(GrammarCompileTimeout) as info:
                future.result()
            assert info.value.field == spec.field and info.value.engine == engine
            assert f"did not compile within {LIMIT:g} s ({engine}); simplify it" in str(info.value)
    assert time.perf_counter() - started < LIMIT + PROMPT  # the limit, not the compile, decided
    assert not compile_children()  # killed, not abandoned

    started = time.perf_counter()
    matcher = cache.matcher(NORMAL, tokenizer, eng)
    assert time.perf_counter() - started < PROMPT
    assert matcher.consume_token(tokenizer.encode("{", add_special=False)[0])
    assert (cache.misses, cache.hits) == (1, 0)  # timed-out grammars are not cached


def test_requests_with_one_grammar_share_one_compile(tokenizer):
    """20 requests with the same schema at once (a client fanning out) wait for one compile: each
    used to start its own, and on a busy machine they timed out together."""
    cache = GrammarCache(timeout=30)
    with ThreadPoolExecutor(20) as pool:
        matchers = list(pool.map(lambda _: cache.matcher(NORMAL, tokenizer, "llguidance"), range(20)))
    assert (cache.misses, cache.hits) == (1, 19)
    assert len({id(m) for m in matchers}) == 20  # each request its own matcher
    first = tokenizer.encode("{", add_special=False)[0]
    assert all(m.consume_token(first) for m in matchers)
    # A failed compile reaches every request that waited for it, and is not cached.
    broken = from_extensions(guided_grammar='start: "a" (')
    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(cache.matcher, broken, tokenizer, "llguidance") for _ in range(4)]
        for future in futures:
            with pytest.raises(InvalidRequest):
                future.result()
    assert (cache.misses, cache.hits) == (1, 19) and not cache._compiling


def test_compiles_running_side_by_side_never_hang_their_children(tokenizer):
    """Requests with different schemas at once: each compile's child is forked while other
    threads compile in the parent and fill masks. Without the fork guard a child inherited a
    grammar-library lock held by another thread and hung (5 of 40 here), so valid schemas were
    refused as too slow."""
    cache = GrammarCache(timeout=5)
    specs = [json_schema_grammar("guided_json", {"type": "object", "properties": {
        f"k{i}_{j}": {"type": "string"} for j in range(20)}}) for i in range(60)]
    busy = cache.matcher(NORMAL, tokenizer, "llguidance")
    stop = threading.Event()

    engine = get_engine("llguidance")
    vocabulary = engine.vocabulary(tokenizer)

    def fill_masks() -> None:  # a serving step's mask work, all along
        bitmask = np.full((1, mask_words(tokenizer.vocab_size)), -1, np.int32)
        while not stop.is_set():
            with library_call():
                engine.fill_masks([busy], bitmask, [0])

    def compile_in_parent() -> None:  # other requests' grammars, compiled again in the parent
        k = 0
        while not stop.is_set():
            with library_call():
                engine.compile(specs[k % len(specs)], vocabulary)
            k += 1

    background = [threading.Thread(target=f, daemon=True) for f in (fill_masks, compile_in_parent)]
    for thread in background:
        thread.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            matchers = list(pool.map(lambda spec: cache.matcher(spec, tokenizer, "llguidance"), specs))
    finally:
        stop.set()
        for thread in background:
            thread.join()
    assert len(matchers) == len(specs) and cache.misses == len(specs) + 1


def test_an_unusable_grammar_is_the_engines_own_error(tokenizer):
    """The child only reports that the compile failed; the parent raises the engine's typed error."""
    broken = from_extensions(guided_grammar='start: "a" (')
    with pytest.raises(InvalidRequest) as info:
        GrammarCache(timeout=5).matcher(broken, tokenizer, "llguidance")
    assert info.value.field == "guided_grammar" and not isinstance(info.value, GrammarCompileTimeout)


class _DyingEngine(GrammarEngine):
    """A compiler that is killed by a signal while compiling (as the OOM killer would)."""

    name = "dying"

    def make_batch_worker(self) -> Any:
        return None

    def vocabulary(self, tokenizer: Any) -> Any:
        return tokenizer

    def compile(self, spec: Any, vocabulary: Any) -> Any:
        os.kill(os.getpid(), signal.SIGKILL)

    def new_matcher(self, template: Any) -> Any:
        raise AssertionError("never compiled")

    def fill_masks(self, matchers, bitmask, rows) -> None:
        raise AssertionError("never compiled")


def test_a_compiler_that_dies_is_a_refusal_not_a_dead_server():
    with pytest.raises(GrammarCompileCrashed) as info:
        GrammarCache(timeout=5).matcher(NORMAL, object(), _DyingEngine())
    assert info.value.field == "guided_json" and f"exit with code {-signal.SIGKILL}" in str(info.value)
    assert not compile_children()
