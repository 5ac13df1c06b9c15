"""``ruvllm serve --ray`` on a multi-node Ray cluster made of network namespaces on this machine.

The cluster is the one ``tests/scaleout/test_multi_node.py`` runs (``ruvllm.scaleout.netns``): a
head host (no Ray CPUs: the Serve controller, HTTP proxy, ingress and metrics board) and N worker
hosts, each its own network, PID and mount namespace with an address on a private bridge,
started with ``ray start``; ``ruvllm serve --ray --replicas N`` runs on the head. Needs root.

``--try``: start one cluster (the first ``--nodes``; each worker pinned to one CPU, round-robin),
print its addresses and wait for Ctrl-C, for a person to point clients at it. Otherwise (one
replica per worker node, every engine ``n_threads=1``):

1. Router overhead, on one worker node (capped at 1 CPU's time; its replica and a direct
   ``ruvllm serve`` beside it answer under the same cap): time to first token (streamed
   ``/v1/completions``, 8 tokens), p50 and p90 over ``--ttft-requests`` sequential request
   pairs, one to the direct server and one to the Ray app on the head, which of the two goes
   first alternating from pair to pair (``--ttft-gap`` seconds of idleness before each pair:
   Serve's routers keep replicas' queue lengths for 10 s, so sparse traffic pays a probe);
   the difference is what the HTTP proxy, the ingress, the router and the cross-node hop add.
   The machine's load average is printed before and after.
2. Aggregate throughput for each node count in ``--nodes``, every worker host capped at
   ``--cpu-per-node`` CPUs' time by a cgroup (equal CPU per node, which whole CPUs cannot give 3
   nodes on 2 cores): ``--clients-per-node`` x N concurrent clients, each sending
   ``--per-client`` chat requests of ``--tokens`` greedy tokens with distinct prompts;
   completion tokens/s over the wall time, and that divided by N (per replica).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from compare_servers import wait_ready  # benchmarks/ is sys.path[0]
from ray_serve import chat, ttft
from ruvllm.bench.machine import machine_line
from ruvllm.scaleout.netns import NetnsCluster, serve_on_head, unavailable_reason

RUVLLM = str(Path(sys.executable).with_name("ruvllm"))
ENGINE = ["--backend", "llamacpp", "-o", "n_threads=1", "--log-level", "warning"]


def load(base: str, clients: int, per_client: int, tokens: int) -> tuple[float, float]:
    """Aggregate completion tokens/s and p50 request latency of ``clients`` concurrent clients."""
    def worker(c: int) -> list[tuple[float, int]]:
        with httpx.Client() as client:
            return [chat(client, base, f"You are assistant number {c}. Answer plainly.",
                         f"Question {c}.{i}: what should a visitor know about rivers?", tokens)
                    for i in range(per_client)]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [x for xs in pool.map(worker, range(clients)) for x in xs]
    wall = time.perf_counter() - start
    return sum(n for _, n in results) / wall, statistics.median(t for t, _ in results)


def overhead(a: argparse.Namespace, logs: Path) -> tuple[list[float], list[float]]:
    """TTFTs of a direct server inside the worker and of the Ray app on the head, alternating."""
    with NetnsCluster(workers=1, cpu_quota=1.0) as cluster:
        served = serve_on_head(cluster, [*ENGINE, "--replicas", "1"], log=logs / "serve-ttft.log")
        w1 = cluster.hosts[1]
        direct = f"http://{w1.ip}:8001"
        proc = cluster.popen(w1, [RUVLLM, "serve", *ENGINE, "--host", w1.ip, "--port", "8001"],
                             stdout=(logs / "direct.log").open("wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            wait_ready(direct, proc, timeout=300)
            with httpx.Client() as client:
                for base in (direct, served.url):
                    ttft(client, base, "Warm up.", 4)
                d, r = [], []
                for i in range(a.ttft_requests):
                    time.sleep(a.ttft_gap)
                    prompt = f"Request {i}: list three fruits."
                    for base in (direct, served.url)[:: 1 if i % 2 == 0 else -1]:
                        (d if base == direct else r).append(ttft(client, base, prompt, 8))
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
            served.stop()
    return d, r


def pct(xs: list[float], q: float) -> float:
    """The ``q`` quantile of ``xs`` (nearest rank), in ms."""
    return sorted(xs)[round(q * (len(xs) - 1))] * 1e3


def throughput(nodes: int, a: argparse.Namespace, logs: Path) -> tuple[float, float]:
    """Aggregate tokens/s and p50 latency of N capped worker nodes under proportional load."""
    with NetnsCluster(workers=nodes, cpu_quota=a.cpu_per_node) as cluster:
        served = serve_on_head(cluster, [*ENGINE, "--replicas", str(nodes)], log=logs / f"serve-{nodes}.log")
        try:
            load(served.url, nodes, 1, 4)  # warm every replica
            return load(served.url, a.clients_per_node * nodes, a.per_client, a.tokens)
        finally:
            served.stop()


def try_it(nodes: int) -> None:
    with NetnsCluster(workers=nodes) as cluster, tempfile.TemporaryDirectory() as tmp:
        served = serve_on_head(cluster, [*ENGINE, "--replicas", str(nodes)], log=Path(tmp) / "serve.log")
        hosts = ", ".join(f"{h.name} {h.ip}" for h in cluster.hosts)
        env = " ".join(f"{k}={cluster.environ[k]}" for k in ("RAY_ADDRESS", "RAY_AUTH_MODE",
                                                               "RAY_AUTH_TOKEN"))
        shell = " ".join(cluster.command(cluster.head, ["bash"]))
        print(f"cluster up: {hosts}\na shell on the head (try `.venv/bin/ray status`): env {env} {shell}\n"
              f"OpenAI API at {served.url}/v1 (also Anthropic /v1/messages, Ollama /api/chat); "
              f"per-replica counters at {served.url}/ray/replicas\nCtrl-C stops and removes everything")
        try:
            while served.proc.poll() is None:
                time.sleep(1)
        except KeyboardInterrupt:
            pass
        finally:
            served.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, nargs="*", default=[1, 2, 3],
                    help="worker node counts to measure throughput at (none: skip)")
    ap.add_argument("--cpu-per-node", type=float, default=0.4, help="CPU time cap of each worker host")
    ap.add_argument("--ttft-requests", type=int, default=30, help="0: skip the router overhead")
    ap.add_argument("--ttft-gap", type=float, default=0.0, help="idle seconds before each TTFT pair")
    ap.add_argument("--clients-per-node", type=int, default=3)
    ap.add_argument("--per-client", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--try", dest="try_it", action="store_true", help="start one cluster and wait")
    a = ap.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"cannot make the namespace cluster: {reason}")
    if a.try_it:
        try_it(a.nodes[0] if a.nodes else 2)
        return
    print(machine_line())
    print(f"each worker node: 1 replica, n_threads=1, capped at {a.cpu_per_node} CPU; "
          f"{a.clients_per_node} clients per node x {a.per_client} chats x {a.tokens} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        if a.ttft_requests:
            before = os.getloadavg()
            d, r = overhead(a, Path(tmp))
            after = os.getloadavg()
            paired = statistics.median(y - x for x, y in zip(d, r, strict=True)) * 1e3
            print(f"TTFT, {a.ttft_requests} sequential pairs, alternating, gap {a.ttft_gap:g} s: direct in "
                  f"the worker p50 {pct(d, .5):.1f} p90 {pct(d, .9):.1f} ms, through Ray p50 "
                  f"{pct(r, .5):.1f} p90 {pct(r, .9):.1f} ms; Ray adds {pct(r, .5) - pct(d, .5):.1f} ms at "
                  f"p50, {pct(r, .9) - pct(d, .9):.1f} at p90 (median of pairs {paired:.1f}); load average "
                  f"{before[0]:.2f} before, {after[0]:.2f} after")
        rows = {n: throughput(n, a, Path(tmp)) for n in a.nodes}
    for n, (tok_s, p50) in rows.items():
        base = rows[min(rows)][0] / min(rows)
        print(f"{n} node(s): {tok_s:.1f} tok/s aggregate, {tok_s / n:.1f} per node (efficiency "
              f"{tok_s / (n * base):.2f} of {n} x the {min(rows)}-node rate), p50 latency {p50:.2f} s")


if __name__ == "__main__":
    main()
