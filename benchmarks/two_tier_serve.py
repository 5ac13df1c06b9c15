"""candle_like's two-tier KV cache through ``ruvllm serve``: memory at a 2,000-token context and
greedy agreement with the FP16 pool, measured from outside the server.

Starts ``ruvllm serve --backend candle_like`` twice on the embedded model, once with the FP16 paged
pool and once with ``-o kv_cache=two_tier``, each with a KV pool sized for one 2,000-token prompt
plus its generation (``kv_cache_tokens``) and one running request. For each it reports the KV the
server said it allocated at start-up (its banner), the server's resident memory after the request,
and the 64 greedy tokens of a 2,000-token prompt sent to ``/v1/completions`` as token ids; then
how many of the 64 agree (identical prefix and count).
"""

from __future__ import annotations

import argparse
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
from ruvllm.bench.machine import machine_line

RUVLLM = Path(sys.executable).with_name("ruvllm")
SENTENCE = "The history of the city begins with a small river port and a market. "


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(proc: subprocess.Popen, base: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}:\n{proc.stderr.read()}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise TimeoutError("server not ready")


def run(name: str, options: list[str], a) -> dict:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [str(RUVLLM), "serve", "--backend", "candle_like", "--port", str(port), "--max-concurrent", "1",
           "-o", f"kv_cache_tokens={a.context + a.tokens + 16}", *options]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        banner = []
        while not any("two-tier" in line or "16-bit pool" in line for line in banner):
            line = proc.stderr.readline()
            if not line:
                raise RuntimeError(f"{name}: server ended before its banner: {''.join(banner)}")
            banner.append(line)
        kv_line = next(line for line in banner if "paged KV" in line).strip()
        wait_ready(proc, base)
        ids = httpx.post(f"{base}/tokenize", json={"prompt": SENTENCE * (a.context // 10 + 1)},
                         timeout=60).json()["tokens"][: a.context]
        t0 = time.perf_counter()
        body = {"prompt": ids, "max_tokens": a.tokens, "temperature": 0, "ignore_eos": True, "logprobs": 0}
        reply = httpx.post(f"{base}/v1/completions", json=body, timeout=900).json()
        seconds = time.perf_counter() - t0
        tokens = reply["choices"][0]["logprobs"]["tokens"]
        rss = psutil.Process(proc.pid).memory_info().rss
        allocated = float(re.findall(r"= ([0-9.]+) MiB", kv_line)[-1] if "two-tier" in kv_line
                          else re.findall(r"([0-9.]+) MiB", kv_line)[-1])
        print(f"{name:9s} {kv_line}", flush=True)
        print(f"{name:9s} KV allocated {allocated:.1f} MiB; server RSS after the request "
              f"{rss / 2**20:.0f} MiB; {a.context}-token prompt + {a.tokens} tokens in {seconds:.1f} s",
              flush=True)
        return {"tokens": tokens, "allocated": allocated, "rss": rss}
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=2000)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--bits", type=int, default=4, choices=(4, 8))
    a = ap.parse_args()
    print(machine_line(), flush=True)
    fp16 = run("fp16", [], a)
    tiers = run("two_tier", ["-o", "kv_cache=two_tier", "-o", f"cold_bits={a.bits}"], a)
    same = sum(x == y for x, y in zip(fp16["tokens"], tiers["tokens"], strict=True))
    prefix = next((i for i, (x, y) in enumerate(zip(fp16["tokens"], tiers["tokens"], strict=True)) if x != y),
                  a.tokens)
    ratio = fp16["allocated"] / tiers["allocated"]
    print(f"through ruvllm serve at {a.context} tokens: two-tier Q{a.bits} KV {ratio:.2f}x smaller than "
          f"fp16 ({tiers['allocated']:.1f} vs {fp16['allocated']:.1f} MiB), server RSS "
          f"{tiers['rss'] / 2**20:.0f} vs {fp16['rss'] / 2**20:.0f} MiB; greedy {a.tokens} tokens: "
          f"{same}/{a.tokens} identical, identical prefix {prefix}")


if __name__ == "__main__":
    main()
