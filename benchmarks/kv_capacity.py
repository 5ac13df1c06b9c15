"""How many long requests run at once before the rest queue: ``ruvllm serve`` (llamacpp, its KV
pool) next to llama.cpp's ``llama-server`` given the same KV memory.

Both servers get the same cells: ruvllm's pool of ``--kv-budget-mib`` (11,520 tokens for the
embedded model at 256 MiB) and llama-server's unified KV of as many cells (``-c``), with
``--parallel`` = the number of requests sent, so slots never limit it. For each prompt size
(1,000 and 4,000 tokens by default) ``--requests`` prompts (different heads, so no prefix is
shared) are sent at once through the official ``openai`` client, each asking for ``--new``
tokens; while they run, the servers' ``/metrics`` are polled (ruvllm's
``ruvllm:num_requests_running``, llama-server's ``llamacpp:requests_processing`` with
``--metrics``) and the most requests seen running at once is the capacity. Also counted:
requests answered (HTTP 200) and the errors of the others.

    .venv/bin/python benchmarks/build_llama_server.py      # once
    .venv/bin/python benchmarks/kv_capacity.py
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import openai
from rich.console import Console
from ruvllm.bench.machine import machine_line
from ruvllm.llm import LLM

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_servers import default_llama_server, free_port, pool_cells, stop, wait_ready
from kv_pool import run_case, sized_prompt

#: Gauges of requests in the running batch, per server.
RUNNING = {"ruvllm": r"^ruvllm:num_requests_running\{[^}]*\} (\S+)",
           "llama-server": r"^llamacpp:requests_processing(?:\{[^}]*\})? (\S+)"}


class RunningPeak:
    """Polls ``url``'s /metrics in a thread; ``peak`` is the most requests seen running."""

    def __init__(self, url: str, kind: str, period: float = 0.2):
        self.url, self.pattern, self.period = url, re.compile(RUNNING[kind], re.M), period
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)

    def _poll(self) -> None:
        with httpx.Client(timeout=10) as client:
            while not self._stop.is_set():
                try:
                    text = client.get(self.url + "/metrics").text
                    self.peak = max(self.peak, int(sum(float(m) for m in self.pattern.findall(text))))
                except httpx.HTTPError:
                    pass
                self._stop.wait(self.period)

    def __enter__(self) -> RunningPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def send_all(url: str, prompts: list[str], new: int) -> tuple[int, list[str], float]:
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=7200)
    model = client.models.list().data[0].id
    return run_case(client, model, prompts, new, extra_body={"ignore_eos": True})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000], help="prompt tokens")
    ap.add_argument("--requests", type=int, default=16, help="requests sent at once per size")
    ap.add_argument("--new", type=int, default=16, help="new tokens per request (EOS ignored)")
    ap.add_argument("--kv-budget-mib", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--servers", nargs="+", default=["ruvllm", "llama-server"],
                    choices=["ruvllm", "llama-server"])
    ap.add_argument("--llama-server", type=Path, default=None)
    args = ap.parse_args()
    console = Console(stderr=True)
    with LLM(backend="llamacpp", options={"n_threads": 1}) as llm:
        model_path = llm.info.path
        cells = pool_cells(llm.backend, args.requests, args.kv_budget_mib)
    llama_server = args.llama_server or default_llama_server()
    if "llama-server" in args.servers and llama_server is None:
        raise SystemExit("no llama-server binary: run benchmarks/build_llama_server.py first")
    print(machine_line())
    rows = []
    for server in args.servers:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        if server == "ruvllm":
            cmd = [str(Path(sys.executable).with_name("ruvllm")), "serve", "--backend", "llamacpp",
                   "--port", str(port), "-o", f"kv_budget_mib={args.kv_budget_mib}",
                   "-o", f"n_threads={args.threads}"]
        else:
            cmd = [str(llama_server), "--model", str(model_path), "--host", "127.0.0.1", "--port", str(port),
                   "--parallel", str(args.requests), "--ctx-size", str(cells), "--kv-unified", "--metrics",
                   "--threads", str(args.threads), "--threads-batch", str(args.threads)]
        log = Path(f"/tmp/kv-capacity-{server}.log")
        with log.open("w") as fh:
            proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
        try:
            wait_ready(url, proc, timeout=600)
            for size in args.sizes:
                prompts = [sized_prompt_any(url, server, size, k) for k in range(args.requests)]
                with RunningPeak(url, server) as peak:
                    ok, errors, wall = send_all(url, prompts, args.new)
                rows.append((server, size, args.requests, peak.peak, ok, wall, errors[:1]))
                console.print(f"  {server} {size}: {peak.peak} at once, {ok}/{args.requests} answered "
                              f"in {wall:.0f} s {errors[:1]}")
        finally:
            stop(proc)
    print(f"KV memory: {args.kv_budget_mib} MiB = {cells} cells on both servers; {args.requests} requests "
          f"sent at once per size, {args.new} new tokens each")
    print("| server | prompt tokens | sent | running at once (peak) | answered (200) | wall s "
          "| first error |")
    print("|---|---|---|---|---|---|---|")
    for server, size, n, peak, ok, wall, err in rows:
        print(f"| {server} | {size} | {n} | {peak} | {ok} | {wall:.0f} | {err[0] if err else ''} |")
    return 0


def sized_prompt_any(url: str, server: str, tokens: int, variant: int) -> str:
    """A prompt of ``tokens`` tokens as this server counts them: ruvllm's /tokenize answers
    ``count``, llama-server's answers the ``tokens`` list."""
    if server == "ruvllm":
        return sized_prompt(url, tokens, variant)
    return sized_prompt(url, tokens, variant, count_field=lambda body: len(body["tokens"]),
                        payload=lambda text: {"content": text})


if __name__ == "__main__":
    sys.exit(main())
