"""The KV pool through the default ``ruvllm serve``: long requests answered, alone and together.

For each backend in ``--backends`` a server is started with its defaults (no option but the
port), its idle resident memory and its KV start-up line are read, then the official ``openai``
client sends, one case after another:

- one prompt of ``--long`` tokens (3,900) + 64 new tokens;
- four such prompts at once (different heads, so no prefix cache helps);
- sixteen prompts of 1,000 tokens at once.

Each case prints how many requests were answered (HTTP 200), the wall time, and the engine's
preemptions from ``/metrics``. A request the server refuses is counted and its error shown: the
target is every request answered. Prompts are sized with the server's own ``/tokenize``.

    .venv/bin/python benchmarks/kv_pool.py                       # llamacpp, the default server
    .venv/bin/python benchmarks/kv_pool.py --backends llamacpp candle_like mlx mistralrs
"""

from __future__ import annotations

import argparse
import concurrent.futures
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import openai
from rich.console import Console
from ruvllm.bench.machine import machine_line

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare_servers import free_port, stop, wait_ready

SENTENCES = (
    "The river bends twice before it reaches the old stone bridge near the market.",
    "Engineers measured the load on each beam and wrote the numbers in a small notebook.",
    "In winter the village library opens late, and children read by the warm stove.",
    "A careful cook tastes the soup, adds a pinch of salt, and lets it simmer again.",
)


def sized_prompt(url: str, tokens: int, variant: int, *,
                 payload: Callable[[str], dict] = lambda text: {"prompt": text},
                 count_field: Callable[[dict], int] = lambda body: body["count"]) -> str:
    """Prose of exactly ``tokens`` prompt tokens as this server counts them (its /tokenize;
    ``payload`` and ``count_field`` adapt it to another server's, e.g. llama-server's)."""
    def count(text: str) -> int:
        r = httpx.post(url + "/tokenize", json=payload(text), timeout=60)
        r.raise_for_status()
        return count_field(r.json())

    notes = [f"Note {variant}-{i}: {SENTENCES[(i + variant) % len(SENTENCES)]}"
             for i in range(tokens // 8)]
    lo, hi = 1, len(notes)
    while lo < hi:  # the most notes that stay within the target
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if count(" ".join(notes[:mid])) <= tokens else (lo, mid - 1)
    text = " ".join(notes[:lo])
    pad = tokens - count(text)
    return text + " ok" * max(pad, 0)


def preemptions(url: str) -> float:
    text = httpx.get(url + "/metrics", timeout=30).text
    return sum(float(m) for m in re.findall(r"^ruvllm:num_preemptions_total\{[^}]*\} (\S+)", text, re.M))


def rss_mb(pid: int) -> float:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024


def run_case(client: openai.OpenAI, model: str, prompts: list[str], max_tokens: int, *,
             extra_body: dict | None = None) -> tuple[int, list[str], float]:
    """Send ``prompts`` at once; (answered, errors, wall seconds). With ``ignore_eos`` in
    ``extra_body`` an answer shorter than ``max_tokens`` was cut short: an error too."""
    full = bool((extra_body or {}).get("ignore_eos"))

    def one(prompt: str) -> str | None:
        try:
            out = client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens,
                                            extra_body=extra_body)
        except openai.APIError as exc:
            return f"{type(exc).__name__}: {str(exc)[:160]}"
        got = out.usage.completion_tokens
        return f"cut short at {got} tokens" if full and got != max_tokens else None

    start = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        errors = [e for e in pool.map(one, prompts) if e]
    return len(prompts) - len(errors), errors, time.perf_counter() - start


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backends", nargs="+", default=["llamacpp"])
    ap.add_argument("--long", type=int, default=3900, help="tokens of the long prompts")
    ap.add_argument("--new", type=int, default=64, help="new tokens of the long requests")
    ap.add_argument("--skip", nargs="*", default=[], choices=["one", "four", "sixteen"])
    args = ap.parse_args()
    console = Console(stderr=True)
    print(machine_line())
    rows = []
    for backend in args.backends:
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        log = Path(f"/tmp/ruvllm-kv-pool-{backend}.log")
        with log.open("w") as fh:
            ruvllm = str(Path(sys.executable).with_name("ruvllm"))
            proc = subprocess.Popen([ruvllm, "serve", "--backend", backend,
                                     "--port", str(port), "--log-level", "info"],
                                    stdout=fh, stderr=subprocess.STDOUT)
        try:
            wait_ready(url, proc, timeout=600)
            time.sleep(2)
            idle = rss_mb(proc.pid)
            banner = [line for line in log.read_text().splitlines() if "KV" in line or "up to" in line]
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=3600)
            model = client.models.list().data[0].id
            console.print(f"[bold]{backend}[/]: idle RSS {idle:.0f} MB; " + " | ".join(banner[-2:]))
            cases = {
                "one": ([sized_prompt(url, args.long, 0)], args.new),
                "four": ([sized_prompt(url, args.long, k) for k in range(1, 5)], args.new),
                "sixteen": ([sized_prompt(url, 1000, k) for k in range(10, 26)], 16),
            }
            for name, (prompts, new) in cases.items():
                if name in args.skip:
                    continue
                before = preemptions(url)
                ok, errors, wall = run_case(client, model, prompts, new)
                rows.append((backend, name, len(prompts), ok, wall, preemptions(url) - before, errors[:1]))
                console.print(f"  {name}: {ok}/{len(prompts)} answered in {wall:.1f} s")
            rows.append((backend, "RSS MB idle / after", 0, 0, idle, rss_mb(proc.pid), []))
        finally:
            stop(proc)
    print("| backend | case | requests | answered (200) | wall s | preemptions | first error |")
    print("|---|---|---|---|---|---|---|")
    for backend, name, n, ok, wall, pre, err in rows:
        if n == 0:
            print(f"| {backend} | {name} | | | {wall:.0f} | {pre:.0f} | |")
        else:
            print(f"| {backend} | {name} | {n} | {ok} | {wall:.1f} | {pre:.0f} | {err[0] if err else ''} |")
    return 0 if all(r[2] == r[3] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
