"""What cached prefixes left in the llama.cpp pool cost later requests, parked and not.

Without flash attention llama.cpp computes each token's attention over every cell in use up to
the highest one, so the prefix cache's donors (finished requests kept for a later hit) slow
every step that runs beside them. ``park_prefixes`` (the default) keeps them in host memory
instead. This script runs the same traffic on two engines of the embedded model, parked and in
the pool, alternating ``--repeats`` times in one process:

- ``C=1 sequential``: four different prompts one after another (each leaves a donor);
- ``C=16 burst``: sixteen 128-token prompts at once, three times (the serving benchmark's
  C=16 case; the second and third run beside the first's donors);
- ``C=1 after the burst``: the four prompts again, one at a time.

It prints output tokens/s per phase (medians), the host memory the parked prefixes take, and
with ``--count-span`` the mean attention span (cells up to the highest in use) per phase, read
from llama.cpp's own KV log (``LLAMA_KV_CACHE_DEBUG``), in a separate slower pass.

    .venv/bin/python benchmarks/llamacpp_parked_prefixes.py --repeats 2 --count-span
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import os
import re
import statistics
import sys
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from llamacpp_multiseq_ceiling import load_prompts
from rich.console import Console
from rich.table import Table
from ruvllm.bench.machine import machine_line
from ruvllm.config import load_config
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.plugins import get_registry
from ruvllm.registry import resolve
from serving import run_engine, sized

SETTINGS = {"parked (default)": True, "in the pool": False}
PHASES = ("C=1 sequential", "C=16 burst", "C=1 after the burst")
#: llama.cpp's KV log line before each placement: n = the highest cell in use + 1.
SPAN_LINE = re.compile(rb"n = +(\d+), used = +(\d+), head = +(\d+)")


class SpanLog:
    """llama.cpp's log while installed: the span of every placement (needs LLAMA_KV_CACHE_DEBUG
    set before the context is created)."""

    def __init__(self, llama_cpp) -> None:
        self.spans: list[int] = []
        self._lib = llama_cpp
        self._callback = llama_cpp.llama_log_callback(self._line)

    def install(self) -> None:
        """Take llama.cpp's log (after a model load, which hands it back to llama-cpp-python)."""
        self._lib.llama_log_set(self._callback, ctypes.c_void_p(0))

    def _line(self, level: int, text: bytes, user_data) -> None:
        m = SPAN_LINE.search(text)
        if m:
            self.spans.append(int(m.group(1)))

    def take_mean(self) -> float:
        spans, self.spans = self.spans, []
        return statistics.mean(spans) if spans else 0.0


def traffic(engine: ServingEngine, spans: SpanLog | None) -> dict[str, tuple[float, float]]:
    """(tok/s, mean span) of each phase on a fresh engine."""
    singles = [sized(engine, p, 300) for p in load_prompts(20)[16:20]]
    burst = [sized(engine, p, 128) for p in load_prompts(16)]

    def run(prompts, max_tokens):
        return asyncio.run(run_engine(engine, prompts, max_tokens))["output_tok_s"]

    out = {}
    for phase in PHASES:
        if spans is not None:
            spans.take_mean()
        if phase == "C=16 burst":
            rates = [run(burst, 64) for _ in range(3)]
        else:
            rates = [run([p], 128) for p in singles]
        out[phase] = (statistics.median(rates), spans.take_mean() if spans is not None else 0.0)
    return out


def engine_for(backend_cls, source, park: bool) -> ServingEngine:
    return ServingEngine(lambda: backend_cls.load(source, {"n_ctx": 0, "park_prefixes": park}),
                         EngineOptions(max_num_seqs=16, max_queue=256))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2, help="rounds of both settings, alternating")
    ap.add_argument("--count-span", action="store_true",
                    help="also count the attention span per phase (a separate, slower pass)")
    args = ap.parse_args()
    source = resolve("default", load_config().cache_dir)
    backend_cls = get_registry().select("llamacpp", source)
    console = Console(stderr=True)
    rates: dict[str, dict[str, list[float]]] = {s: {p: [] for p in PHASES} for s in SETTINGS}
    parked_mib: list[float] = []
    for round_ in range(args.repeats):
        for setting, park in SETTINGS.items():
            console.print(f"round {round_ + 1}/{args.repeats}: {setting}")
            with engine_for(backend_cls, source, park) as engine:
                for phase, (rate, _) in traffic(engine, None).items():
                    rates[setting][phase].append(rate)
                if park:
                    executor = engine._core.executor  # the benchmark's look inside the engine
                    parked_mib.append(engine.call(partial(getattr, executor, "parked_bytes")) / (1 << 20))
    spans: dict[str, dict[str, float]] = {}
    if args.count_span:
        os.environ["LLAMA_KV_CACHE_DEBUG"] = "1"  # read when a context is created
        import llama_cpp

        log = SpanLog(llama_cpp)
        for setting, park in SETTINGS.items():
            console.print(f"counting spans: {setting}")
            with engine_for(backend_cls, source, park) as engine:
                engine.call(log.install)  # the engine has loaded its model by now
                spans[setting] = {phase: span for phase, (_, span) in traffic(engine, log).items()}

    table = Table(title=f"cached prefixes parked or in the pool: output tok/s, median of {args.repeats}"
                        + (" (mean attention span in cells)" if spans else ""))
    table.add_column("phase")
    for setting in SETTINGS:
        table.add_column(setting, justify="right")
    table.add_column("ratio", justify="right")
    for phase in PHASES:
        cells = []
        for setting in SETTINGS:
            text = f"{statistics.median(rates[setting][phase]):.1f}"
            if spans:
                text += f" ({spans[setting][phase]:.0f})"
            cells.append(text)
        parked, in_pool = (statistics.median(rates[s][phase]) for s in SETTINGS)
        ratio = parked / in_pool
        table.add_row(phase, *cells, f"{ratio:.2f}x")
    out = Console()
    out.print(machine_line())
    out.print(table)
    out.print(f"host memory of the parked prefixes at the end: {max(parked_mib):.1f} MiB")


if __name__ == "__main__":
    main()
