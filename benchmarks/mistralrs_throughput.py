"""mistral.rs aggregate decode throughput with 1, 4 and 16 requests in flight, through ruvllm and
straight on mistral.rs.

Three ways to drive the same model, each with N greedy requests started together:

* ``engine``: ruvllm's ServingEngine, request-level path (``max_in_flight = N``), i.e. what the
  server does; each request is one streaming mistral.rs request and mistral.rs batches the
  decode steps of the requests it runs (``max_seqs``).
* ``backend``: N threads each calling the backend's ``generate`` (no engine in between).
* ``runner``: mistral.rs's own ``Runner``, no ruvllm: N streaming requests submitted from one
  thread and each stream read by its own thread; with ``serial prefill`` (on for GGUF/ISQ, as in
  the backend) each request is submitted after the previous one produced its first token.

Aggregate throughput = all completion tokens / wall time from the first submit to the last
token; TTFT = median time to each request's first token. Prompts differ per request.

    .venv/bin/python benchmarks/mistralrs_throughput.py --concurrency 1 4 16 --tokens 32 --runs 3

Prints the machine, load average, versions, settings and the median of --runs runs.
"""

from __future__ import annotations

import argparse
import itertools
import os
import platform
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ruvllm.bench.machine import machine_line
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.registry import resolve
from ruvllm.types import GenerationParams
from ruvllm_mistralrs import MistralRsBackend
from ruvllm_mistralrs.engine import PASS_THROUGH_TEMPLATE, runner_kwargs, which_for
from ruvllm_mistralrs.model_files import read_model_files
from ruvllm_mistralrs.options import MistralRsOptions
from ruvllm_mistralrs.platform import installed_build
from ruvllm_mistralrs.requantize import resolve_isq

PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):", "Water boils at",
           "List three colors: red, green,", "In 1492, Columbus", "My favourite food is", "Hello",
           "The best way to learn a language is", "A recipe for pancakes:", "Dear Sir or Madam,",
           "The theory of relativity states", "import numpy as np\n", "Top 5 tourist sites in Rome:",
           "Photosynthesis is", "The weather today is"]

#: (aggregate tok/s, median TTFT s) for one level.
Level = tuple[float, float]


def prompt(k: int) -> str:
    return PROMPTS[k % len(PROMPTS)] + f" ({k})"


def _threads(n: int, work: Callable[[int], None]) -> float:
    """Run ``work(k)`` for k < n on n threads; wall seconds. Re-raises the first failure."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            work(k)
        except BaseException as exc:  # reported after the run
            errors.append(exc)

    start = time.perf_counter()
    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError(f"{len(errors)} request(s) failed: {errors[0]!r}")
    return time.perf_counter() - start


def via_backend(backend: MistralRsBackend, n: int, tokens: int) -> Level:
    params = GenerationParams(max_tokens=tokens, ignore_eos=True)
    counts, ttft = [0] * n, [0.0] * n
    start = time.perf_counter()

    def work(k: int) -> None:
        for i, _ in enumerate(backend.generate(backend.tokenizer.encode(prompt(k)), params)):
            if i == 0:
                ttft[k] = time.perf_counter() - start
            counts[k] += 1

    elapsed = _threads(n, work)
    return sum(counts) / elapsed, statistics.median(ttft)


def via_engine(engine: ServingEngine, n: int, tokens: int) -> Level:
    params = GenerationParams(max_tokens=tokens, ignore_eos=True)
    prompts = [engine.encode(prompt(k)) for k in range(n)]
    counts, ttft = [0] * n, [0.0] * n
    start = time.perf_counter()
    handles = [engine.submit_sync(ids, params) for ids in prompts]

    def work(k: int) -> None:
        for out in handles[k]:
            if not counts[k]:
                ttft[k] = time.perf_counter() - start
            counts[k] += out.token_id is not None
        handles[k].result()

    _threads(n, work)
    return sum(counts) / (time.perf_counter() - start), statistics.median(ttft)


def via_runner(m: Any, runner: Any, n: int, tokens: int, serial: bool) -> Level:
    """mistral.rs alone: submit from this thread (the Runner's owner), read each stream on its own
    thread. Serial admission waits for each request's first chunk before the next submit."""
    counts, ttft = [0] * n, [0.0] * n
    firsts: list[Any] = [None] * n
    streams: list[Any] = []
    start = time.perf_counter()
    for k in range(n):
        request = m.ChatCompletionRequest(messages=[{"role": "user", "content": prompt(k)}], model="default",
                                          max_tokens=tokens, temperature=0.0, stream=True, ignore_eos=True)
        stream = runner.send_chat_completion_request(request)
        if serial:
            firsts[k] = next(stream)
            ttft[k] = time.perf_counter() - start
        streams.append(stream)

    def work(k: int) -> None:
        first = [firsts[k]] if firsts[k] is not None else []
        for chunk in itertools.chain(first, streams[k]):
            if not ttft[k]:
                ttft[k] = time.perf_counter() - start
            counts[k] += 1  # one sampled token per streamed chunk
            usage = getattr(chunk, "usage", None)
            if usage is not None:  # the last chunk's count is exact
                counts[k] = usage.completion_tokens

    _threads(n, work)
    return sum(counts) / (time.perf_counter() - start), statistics.median(ttft)


def direct_runner(m: Any, source: Any, opts: MistralRsOptions, tmp: Path) -> Any:
    template = tmp / "pass_through.jinja"
    template.write_text(PASS_THROUGH_TEMPLATE, encoding="utf-8")
    build = installed_build()
    # The isq the backend would resolve for this file (its "auto" included).
    isq = resolve_isq(opts.isq, source, read_model_files(source).quantization, build).isq
    return m.Runner(which=which_for(m, source, opts), **runner_kwargs(m, opts, build, template, isq=isq))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--via", nargs="+", default=["engine", "runner"], choices=["engine", "backend", "runner"])
    ap.add_argument("--threads", type=int, default=None, help="mistral.rs CPU threads")
    ap.add_argument("--model", default="default", help="model reference or HF dir")
    ap.add_argument("--max-seqs", type=int, default=None, help="default: the largest concurrency")
    ap.add_argument("--prefix-cache", type=int, default=0, help="prefix_cache_size (finished sequences kept)")
    ap.add_argument("--isq", default=None)
    ap.add_argument("--dtype", default="auto", choices=["auto", "bf16", "f16", "f32"])
    ap.add_argument("--serial-prefill", default="auto", choices=["auto", "on", "off"])
    args = ap.parse_args()
    source = resolve(args.model, os.path.expanduser("~/.cache/ruvllm"))
    options: dict[str, Any] = {"max_seqs": args.max_seqs or max(args.concurrency),
                               "prefix_cache_size": args.prefix_cache, "serial_prefill": args.serial_prefill,
                               "dtype": args.dtype}
    if args.threads:
        options["threads"] = args.threads
    if args.isq:
        options["isq"] = args.isq
    import mistralrs

    build = installed_build()
    print(machine_line())
    print("load average (1, 5, 15 min): " + " ".join(f"{x:.1f}" for x in os.getloadavg()))
    print(f"versions: {build.distribution} {build.version}, python {platform.python_version()}, "
          f"MISTRALRS_CPU_KV_F32={os.environ.get('MISTRALRS_CPU_KV_F32', 'unset')}")
    print(f"model {source.name} ({source.format}), options {options}")
    print(f"{args.tokens} greedy tokens per request, median of {args.runs} runs")
    backend = MistralRsBackend.load(source, options)
    serial = backend.serial_prefill
    print(f"serial prefill: {serial}")
    levels: dict[str, Callable[[int], Level]] = {}
    engine = None
    try:
        if "engine" in args.via:
            engine_options = EngineOptions(path="request", max_in_flight=max(args.concurrency))
            engine = ServingEngine(backend, engine_options, owns_backend=False)
            levels["engine"] = lambda n: via_engine(engine, n, args.tokens)
        if "backend" in args.via:
            levels["backend"] = lambda n: via_backend(backend, n, args.tokens)
        for via, level in levels.items():
            level(1)  # warm-up
            for n in args.concurrency:
                runs = [level(n) for _ in range(args.runs)]
                report(via, n, runs)
    finally:
        if engine is not None:
            engine.close()
        backend.close()
    if "runner" in args.via:
        opts = MistralRsOptions(**{k: v for k, v in options.items() if k != "threads"})
        with tempfile.TemporaryDirectory() as tmp:
            runner = direct_runner(mistralrs, source, opts, Path(tmp))
            via_runner(mistralrs, runner, 1, 4, serial)  # warm-up
            for n in args.concurrency:
                report("runner", n, [via_runner(mistralrs, runner, n, args.tokens, serial)
                                     for _ in range(args.runs)])
            del runner
    print(f"load average after: {' '.join(f'{x:.1f}' for x in os.getloadavg())}")


def report(via: str, n: int, runs: list[Level]) -> None:
    tps = statistics.median(r[0] for r in runs)
    ttft = statistics.median(r[1] for r in runs)
    print(f"{via:8s} concurrency {n:3d}: {tps:7.1f} tok/s aggregate, median TTFT {ttft * 1000:7.0f} ms",
          flush=True)


if __name__ == "__main__":
    main()
