"""``ruvllm serve --ray`` on a multi-node Ray cluster made of network namespaces on this machine.

The cluster is the one ``tests/scaleout/test_multi_node.py`` runs (``ruvllm.scaleout.netns``): a
head host (no Ray CPUs: the Serve controller, HTTP proxy, ingress and metrics board) and N worker
hosts, each its own network, PID and mount namespace with an address on a private bridge,
started with ``ray start``; ``ruvllm serve --ray --replicas N`` runs on the head. Needs root.

``--try``: start one cluster (the first ``--nodes``), print its addresses and wait for Ctrl-C,
for a person to point clients at it. Otherwise, for each node count in ``--nodes`` (one replica
per worker node, every engine ``n_threads=1``, every worker host capped at ``--cpu-per-node``
CPUs' time by a cgroup, so that 1, 2 and 3 nodes get equal CPU each on a 2-core machine):

1. Router overhead: time to first token (streamed ``/v1/completions``, 8 tokens), p50 over
   sequential requests sent alternately to a direct ``ruvllm serve`` running inside worker 1
   (same CPU cap) and to the Ray app on the head; the difference is what the HTTP proxy, the
   ingress, the router and the cross-node hops add.
2. Aggregate throughput: ``--clients-per-node`` x N concurrent clients, each sending
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


def measure(nodes: int, a: argparse.Namespace, logs: Path) -> dict[str, float]:
    with NetnsCluster(workers=nodes, cpu_quota=a.cpu_per_node) as cluster:
        served = serve_on_head(cluster, [*ENGINE, "--replicas", str(nodes)], log=logs / f"serve-{nodes}.log")
        w1 = cluster.hosts[1]
        direct = f"http://{w1.ip}:8001"
        proc = cluster.popen(w1, [RUVLLM, "serve", *ENGINE, "--host", w1.ip, "--port", "8001"],
                             stdout=(logs / f"direct-{nodes}.log").open("wb"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            wait_ready(direct, proc, timeout=300)
            with httpx.Client() as client:
                for base in (direct, served.url):
                    ttft(client, base, "Warm up.", 4)
                d, r = [], []
                for i in range(a.ttft_requests):
                    prompt = f"Request {i}: list three fruits."
                    d.append(ttft(client, direct, prompt, 8))
                    r.append(ttft(client, served.url, prompt, 8))
            os.killpg(proc.pid, signal.SIGINT)  # its CPU goes back to the replica
            proc.wait(timeout=30)
            tok_s, p50 = load(served.url, a.clients_per_node * nodes, a.per_client, a.tokens)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            served.stop()
    return {"direct_ttft": statistics.median(d), "ray_ttft": statistics.median(r), "tok_s": tok_s, "p50": p50}


def try_it(nodes: int, cpu: float | None) -> None:
    with NetnsCluster(workers=nodes, cpu_quota=cpu) as cluster, tempfile.TemporaryDirectory() as tmp:
        served = serve_on_head(cluster, [*ENGINE, "--replicas", str(nodes)], log=Path(tmp) / "serve.log")
        hosts = ", ".join(f"{h.name} {h.ip}" for h in cluster.hosts)
        print(f"cluster up: {hosts}; RAY_ADDRESS={cluster.address}\n"
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
    ap.add_argument("--nodes", type=int, nargs="+", default=[1, 2, 3], help="worker node counts to run")
    ap.add_argument("--cpu-per-node", type=float, default=0.5, help="CPU time cap of each worker host")
    ap.add_argument("--ttft-requests", type=int, default=20)
    ap.add_argument("--clients-per-node", type=int, default=3)
    ap.add_argument("--per-client", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--try", dest="try_it", action="store_true", help="start one cluster and wait")
    a = ap.parse_args()
    reason = unavailable_reason()
    if reason:
        raise SystemExit(f"cannot make the namespace cluster: {reason}")
    if a.try_it:
        try_it(a.nodes[0], a.cpu_per_node)
        return
    print(machine_line())
    print(f"each worker node: 1 replica, n_threads=1, capped at {a.cpu_per_node} CPU; "
          f"{a.clients_per_node} clients per node x {a.per_client} chats x {a.tokens} tokens")
    with tempfile.TemporaryDirectory() as tmp:
        rows = {n: measure(n, a, Path(tmp)) for n in a.nodes}
    base = rows[min(rows)]["tok_s"] / min(rows)
    for n, m in rows.items():
        print(f"{n} node(s): TTFT p50 direct {m['direct_ttft'] * 1e3:.1f} ms, through Ray "
              f"{m['ray_ttft'] * 1e3:.1f} ms (+{(m['ray_ttft'] - m['direct_ttft']) * 1e3:.1f} ms); "
              f"{m['tok_s']:.1f} tok/s aggregate, {m['tok_s'] / n:.1f} per node "
              f"(efficiency {m['tok_s'] / (n * base):.2f} of {n} x the {min(rows)}-node rate), "
              f"p50 latency {m['p50']:.2f} s")


if __name__ == "__main__":
    main()
