"""``ruvllm serve --ray`` against single-process ``ruvllm serve`` on the embedded model.

Three measurements, side by side in one run (this machine is shared: quote the ratios):

1. Ray's added latency: time to first token (streamed ``/v1/completions``, 8 tokens), p50 over
   sequential requests sent alternately to the direct server and to the Ray app (2 replicas).
2. 1 vs 2 replicas under the same load: C concurrent clients, each sending R chat requests of
   T greedy tokens; aggregate completion tokens/s and p50 request latency. On a 2-core machine
   no gain is expected (both replicas share the same two cores); the point is the overhead.
3. Prefix-cache hit rate on a shared-prefix workload (P system prompts of ~55 tokens, Q
   questions each, shuffled, 2 concurrent clients) with the prefix-affinity router vs Serve's
   default router (power of two choices), from the replicas' own prefix-cache counters. Every
   round deploys both routers afresh (empty prefix caches; new replica ids, so the affinity
   router's hash places the prefixes anew), alternating which goes first; the figure is the
   median over ``--rounds``, at each ``--donor-slots`` setting (``prefix_donor_slots``: how many
   finished prompts an engine keeps for reuse; with 4 prefixes over 2 replicas, 2 slots each
   are exactly enough only when the prefixes split 2/2).

Ray runs locally (num_cpus=2, no dashboard); the 2 cores are split between the replicas (each
asks Ray for 2/N CPUs); every engine, the direct one too, runs ``--threads`` backend threads
(default 1). The direct server is a ``ruvllm serve`` subprocess on the same model and backend.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import httpx
from compare_servers import free_port, wait_ready  # benchmarks/ is sys.path[0]
from ruvllm.bench.machine import machine_line
from ruvllm.engine.options import EngineOptions

RUVLLM = Path(sys.executable).with_name("ruvllm")
SYSTEMS = [
    "You are a support agent for a bicycle shop. The shop repairs road, mountain and city bikes, "
    "sells parts from six brands, and offers a free check-up within thirty days of any purchase. ",
    "You are a tutor for first-year chemistry. Explain with one everyday example, use SI units, "
    "and never give the final numeric answer before the student has tried the problem once. ",
    "You answer questions about a city's public transport: three metro lines, forty bus routes, "
    "night buses on weekends, and a single ticket valid for ninety minutes on every vehicle. ",
    "You are a travel planner for a mountain region with twelve huts, marked trails graded easy "
    "to alpine, a summer season from June to September and mandatory hut reservations. ",
]


def ttft(client: httpx.Client, base: str, prompt: str, tokens: int) -> float:
    body = {"prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True}
    start = time.perf_counter()
    with client.stream("POST", f"{base}/v1/completions", json=body, timeout=120) as r:
        r.raise_for_status()
        first = None
        for line in r.iter_lines():
            if first is None and line.startswith("data: ") and '"text"' in line:
                first = time.perf_counter() - start
    if first is None:
        raise RuntimeError("no token streamed")
    return first


def chat(client: httpx.Client, base: str, system: str, question: str, tokens: int) -> tuple[float, int]:
    body = {"messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "max_tokens": tokens, "temperature": 0}
    start = time.perf_counter()
    r = client.post(f"{base}/v1/chat/completions", json=body, timeout=300)
    r.raise_for_status()
    return time.perf_counter() - start, r.json()["usage"]["completion_tokens"]


def load_run(base: str, clients: int, per_client: int, tokens: int) -> dict:
    def worker(c: int) -> list[tuple[float, int]]:
        with httpx.Client() as client:
            return [chat(client, base, SYSTEMS[c % len(SYSTEMS)], f"Question {c}.{i}: what should I know?",
                         tokens) for i in range(per_client)]

    start = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        results = [x for xs in pool.map(worker, range(clients)) for x in xs]
    wall = time.perf_counter() - start
    return {"tok_s": sum(n for _, n in results) / wall, "p50_s": statistics.median(t for t, _ in results),
            "load": os.getloadavg()[0]}


def replica_counters(base: str) -> tuple[int, int]:
    reps = httpx.get(f"{base}/ray/replicas", timeout=10).json()["replicas"]
    return sum(r["prefix_cache_queries"] for r in reps), sum(r["prefix_cache_hits"] for r in reps)


def finished(base: str) -> int:
    reps = httpx.get(f"{base}/ray/replicas", timeout=10).json()["replicas"]
    return sum(sum(r["requests_finished"].values()) for r in reps)


def prefix_run(base: str, per_prefix: int, tokens: int, seed: int) -> float:
    jobs = [(s, f"Question {q}: what is the most important thing to know?")
            for s in SYSTEMS for q in range(per_prefix)]
    random.Random(seed).shuffle(jobs)
    q0, h0 = replica_counters(base)
    done0 = finished(base)
    with ThreadPoolExecutor(2) as pool, httpx.Client() as client:
        list(pool.map(lambda j: chat(client, base, j[0], j[1], tokens), jobs))
    deadline = time.monotonic() + 10
    while finished(base) < done0 + len(jobs) and time.monotonic() < deadline:
        time.sleep(0.2)
    q1, h1 = replica_counters(base)
    return (h1 - h0) / max(1, q1 - q0)


def percents(xs: list[float]) -> str:
    return " ".join(f"{x:.1%}" for x in xs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ttft-requests", type=int, default=20)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--per-client", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--per-prefix", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3, help="fresh deployments per router (hit rate)")
    ap.add_argument("--donor-slots", type=int, nargs="+", default=[2, 4],
                    help="prefix_donor_slots settings for the hit-rate rounds (engine default: "
                         f"{EngineOptions().prefix_donor_slots}, the backend's count)")
    ap.add_argument("--backend", default="llamacpp")
    ap.add_argument("--threads", type=int, default=1, help="n_threads of every engine (default 1)")
    a = ap.parse_args()

    import ray
    from ray import serve
    from ruvllm.config import load_config
    from ruvllm.scaleout.app import ScaleOutSettings, build_replicas, http_in_thread

    print(machine_line())
    print(f"backend {a.backend}, embedded model, ray {ray.__version__}, greedy")
    direct_port = free_port()
    direct = f"http://127.0.0.1:{direct_port}"
    proc = subprocess.Popen([str(RUVLLM), "serve", "--backend", a.backend, "--port", str(direct_port),
                             "--log-level", "warning", "-o", f"n_threads={a.threads}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        wait_ready(direct, proc, timeout=300)
        serve.start(proxy_location="Disabled")
        config = load_config(overrides={"backend": a.backend, "model": "default"})

        @contextlib.contextmanager
        def deployed(replicas: int, *, engine: dict | None = None, **kw) -> Iterator[str]:
            """A fresh deployment (empty prefix caches, new replica ids) and its HTTP server, as
            ``ruvllm serve --ray`` runs them. The 2 cores are split between the replicas (each
            asks Ray for its share); every engine, the direct one too, runs --threads backend
            threads: on a shared machine OpenMP threads spinning against other load dominate
            every other effect."""
            cpus = max(1, 2 // replicas)
            opts = {**config.options_for(a.backend), "n_threads": a.threads}
            cfg = attrs.evolve(config, backends={**config.backends, a.backend: opts},
                               server=attrs.evolve(config.server, port=free_port())).with_engine(engine)
            scale = ScaleOutSettings(name="bench", replicas=replicas, ray_actor_options={"num_cpus": cpus},
                                     **kw)
            serve.run(build_replicas(cfg, scale), name="bench", route_prefix=None)  # returns when ready
            try:
                with http_in_thread(cfg, scale) as url:
                    yield url
            finally:
                serve.delete("bench")

        def hit_rates(slots: int) -> dict[bool, list[float]]:
            rates: dict[bool, list[float]] = {True: [], False: []}
            for rnd in range(a.rounds):
                for affinity in ((True, False) if rnd % 2 == 0 else (False, True)):
                    with deployed(2, engine={"prefix_donor_slots": slots}, prefix_affinity=affinity) as url:
                        rates[affinity].append(prefix_run(url, a.per_prefix, 8, seed=rnd))
            return rates

        with deployed(2) as via_ray:
            with httpx.Client() as client:
                for base in (direct, via_ray):  # warm both
                    ttft(client, base, "Warm up.", 4)
                d, r = [], []
                for i in range(a.ttft_requests):
                    prompt = f"Request {i}: list three fruits."
                    d.append(ttft(client, direct, prompt, 8))
                    r.append(ttft(client, via_ray, prompt, 8))
            d50, r50 = statistics.median(d), statistics.median(r)
            print(f"TTFT p50 ({a.ttft_requests} sequential requests, alternating): direct "
                  f"{d50 * 1e3:.1f} ms, through Ray {r50 * 1e3:.1f} ms; Ray adds {(r50 - d50) * 1e3:.1f} ms "
                  f"({r50 / d50:.2f}x)")
            two = load_run(via_ray, a.clients, a.per_client, a.tokens)
        rates = {slots: hit_rates(slots) for slots in a.donor_slots}
        with deployed(1) as via_ray:
            one = load_run(via_ray, a.clients, a.per_client, a.tokens)
        base_direct = load_run(direct, a.clients, a.per_client, a.tokens)
        print(f"load: {a.clients} clients x {a.per_client} chat requests x {a.tokens} tokens")
        rows = (("direct ruvllm serve", base_direct), ("Ray, 1 replica", one), ("Ray, 2 replicas", two))
        for name, m in rows:
            print(f"  {name:20s} {m['tok_s']:7.1f} tok/s  p50 latency {m['p50_s']:.2f} s  "
                  f"({m['tok_s'] / base_direct['tok_s']:.2f}x direct; machine load {m['load']:.1f})")
        print(f"prefix-cache hit rate, {len(SYSTEMS)} shared system prompts x {a.per_prefix} questions, "
              f"2 concurrent, 2 replicas, median of {a.rounds} fresh deployments per router:")
        for slots, r in rates.items():
            aff, dflt = statistics.median(r[True]), statistics.median(r[False])
            print(f"  prefix_donor_slots={slots}: affinity router {aff:.1%} (rounds {percents(r[True])}), "
                  f"Serve default router {dflt:.1%} (rounds {percents(r[False])}); "
                  f"ratio {aff / dflt if dflt else float('inf'):.2f}")
    finally:
        serve.shutdown()
        ray.shutdown()
        proc.terminate()
        proc.wait(timeout=30)


if __name__ == "__main__":
    main()
