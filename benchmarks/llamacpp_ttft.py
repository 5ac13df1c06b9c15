"""Time to first token at one client: ``ruvllm serve`` against llama-server, split into the
prefill each server reports and everything else (HTTP, tokenizing, queueing, the SSE write);
and, with ``--n-predict`` above 1, each token after the first (the server's own
``predicted_per_token_ms`` and the client's inter-token gap).

Both servers are up at once (llama-server as benchmarks/compare_servers.py runs it: the same
threads and KV cells, unified KV, ``--parallel 16``) and take turns, the first side alternating
request by request, so machine noise hits both alike. Every prompt is sent twice in a row to a
server: ``fresh`` (its first time, nothing cached: no two prompts share a first token,
``ruvllm.bench.prompts.fresh_prompts``) and ``repeat`` (the same prompt again, which both
servers answer from their prompt cache).

Each request is a streaming llama-server ``/completion`` (ruvllm serves that API too), so both
report ``timings.prompt_ms``: llama-server's prompt processing, ruvllm's time from the request's
first step to its first sampled token. ``TTFT - prompt_ms`` is what the serving path adds.

    .venv/bin/python benchmarks/build_llama_server.py     # once (~17 min on 2 cores)
    .venv/bin/python benchmarks/llamacpp_ttft.py --requests 20 --prompt-length 64
    .venv/bin/python benchmarks/llamacpp_ttft.py --prompt-length 32 -- -e max_batch_tokens=256
    .venv/bin/python benchmarks/llamacpp_ttft.py --requests 12 --n-predict 64   # decode too

Arguments after ``--`` go to ``ruvllm serve``. Prints medians and the load average before and
after; writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx
from compare_servers import default_llama_server, free_port, pool_cells, run_server, stop
from ruvllm.bench.machine import machine_info, machine_line
from ruvllm.bench.prompts import fresh_prompts
from ruvllm.hardware import usable_cpus
from ruvllm.llm import LLM

RESULTS = Path(__file__).resolve().parent / "results"


def one_request(client: httpx.Client, url: str, prompt: str, n_predict: int) -> dict:
    """Client TTFT (first streamed text), the server's own prompt_ms, and per token after the
    first: the server's predicted_per_token_ms and the client's mean gap, in ms."""
    body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "stream": True,
            "ignore_eos": True, "cache_prompt": True}
    start = time.perf_counter()
    first = last = None
    pieces = 0
    final: dict = {}
    # A new connection each time, on both sides: llama-server may close one after a stream.
    with client.stream("POST", url + "/completion", json=body, headers={"Connection": "close"}) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event.get("content"):
                last = time.perf_counter()
                first = first or last
                pieces += 1
            if event.get("stop"):
                final = event
    if first is None or "timings" not in final:
        raise SystemExit(f"{url}: no token or no timings in the stream: {final}")
    ttft = (first - start) * 1000
    prompt_ms = float(final["timings"]["prompt_ms"])
    return {"ttft_ms": ttft, "prompt_ms": prompt_ms, "rest_ms": ttft - prompt_ms,
            "prompt_n": final["timings"].get("prompt_n"),
            "decode_ms": float(final["timings"].get("predicted_per_token_ms") or 0.0),
            "gap_ms": (last - first) * 1000 / (pieces - 1) if pieces > 1 else 0.0}


FIELDS = ("ttft_ms", "prompt_ms", "rest_ms", "prompt_n", "decode_ms", "gap_ms")


def summary(rows: list[dict]) -> dict:
    return {k: statistics.median(r[k] for r in rows) for k in FIELDS}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20, help="prompts per server (each sent twice)")
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--n-predict", type=int, default=4)
    ap.add_argument("--threads", type=int, default=usable_cpus())
    ap.add_argument("--llama-server", type=Path, default=None, help="binary (default: build_llama_server's)")
    ap.add_argument("--kv-budget-mib", type=int, default=256)
    ap.add_argument("serve_args", nargs="*", help="after --: more `ruvllm serve` flags")
    args = ap.parse_args()

    llama_server = args.llama_server or default_llama_server()
    if llama_server is None or not llama_server.exists():
        raise SystemExit("no llama-server: run benchmarks/build_llama_server.py (make peers) first")
    with LLM(backend="llamacpp") as llm:
        model_path = llm.model.path
        prompts = fresh_prompts(llm.tokenizer, [args.prompt_length] * (args.requests + 1))
        cells = pool_cells(llm.backend, 16, args.kv_budget_mib)
    out_dir = RESULTS / f"llamacpp_ttft-{time.strftime('%Y%m%d-%H%M%S')}"
    out_dir.mkdir(parents=True, exist_ok=True)
    bin_dir = Path(sys.executable).parent
    ruv_url, peer_url = (f"http://127.0.0.1:{free_port()}" for _ in range(2))
    ruv_cmd = [str(bin_dir / "ruvllm"), "serve", "--port", ruv_url.rsplit(":", 1)[1],
               "--log-level", "warning", "--no-ui", "-o", f"n_threads={args.threads}", *args.serve_args]
    peer_cmd = [str(llama_server), "--model", str(model_path), "--host", "127.0.0.1",
                "--port", peer_url.rsplit(":", 1)[1], "--parallel", "16", "--ctx-size", str(cells),
                "--kv-unified", "--threads", str(args.threads), "--threads-batch", str(args.threads)]
    sides = {"ruvllm serve": ruv_url, "llama-server": peer_url}
    procs = [run_server(ruv_cmd, ruv_url, out_dir / "ruvllm-serve.log"),
             run_server(peer_cmd, peer_url, out_dir / "llama-server.log")]
    rows: dict[str, dict[str, list[dict]]] = {s: {"fresh": [], "repeat": []} for s in sides}
    load_before = list(os.getloadavg())
    try:
        with httpx.Client(timeout=600) as client:
            for url in sides.values():  # warm-up: threads, allocations, first-use paths
                one_request(client, url, prompts[-1], args.n_predict)
                one_request(client, url, prompts[-1], args.n_predict)
            for i, prompt in enumerate(prompts[:-1]):
                order = list(sides.items()) if i % 2 == 0 else list(sides.items())[::-1]
                for name, url in order:
                    rows[name]["fresh"].append(one_request(client, url, prompt, args.n_predict))
                    rows[name]["repeat"].append(one_request(client, url, prompt, args.n_predict))
    finally:
        for proc in procs:
            stop(proc)
    load_after = list(os.getloadavg())

    print(machine_line())
    print(f"prompt {args.prompt_length} tokens, {args.requests} prompts per server, each fresh then "
          f"repeated, n_predict {args.n_predict}, threads {args.threads}; load avg before {load_before}, "
          f"after {load_after}")
    print(f"ruvllm serve {' '.join(args.serve_args)}; llama-server -np 16 -c {cells} --kv-unified")
    print(f"{'server':<14} {'prompts':<7} {'TTFT p50':>9} {'prompt_ms':>10} {'rest':>8} {'prompt_n':>9}"
          f" {'decode':>7} {'gap':>7}   (ms, medians; prompt_n: tokens computed; decode: the server's "
          "ms per token after the first, gap: the client's)")
    medians = {}
    for name, kinds in rows.items():
        for kind, rs in kinds.items():
            m = medians.setdefault(name, {})[kind] = summary(rs)
            print(f"{name:<14} {kind:<7} {m['ttft_ms']:>9.1f} {m['prompt_ms']:>10.1f} {m['rest_ms']:>8.1f} "
                  f"{m['prompt_n']:>9.0f} {m['decode_ms']:>7.2f} {m['gap_ms']:>7.2f}")
    pair_ratios = {}
    for kind in ("fresh", "repeat"):
        ratio = medians["ruvllm serve"][kind]["ttft_ms"] / medians["llama-server"][kind]["ttft_ms"]
        # Each prompt's two sides ran back to back: their ratio sees the same machine load.
        pairs = [a["ttft_ms"] / b["ttft_ms"]
                 for a, b in zip(rows["ruvllm serve"][kind], rows["llama-server"][kind], strict=True)]
        pair_ratios[kind] = statistics.median(pairs)
        print(f"TTFT ruvllm / llama-server, {kind}: {ratio:.2f}x (ratio of p50s), "
              f"{pair_ratios[kind]:.2f}x (median of per-prompt ratios)")
        if args.n_predict > 1:
            gaps = [a["gap_ms"] / b["gap_ms"]
                    for a, b in zip(rows["ruvllm serve"][kind], rows["llama-server"][kind], strict=True)]
            pair_ratios[f"{kind}_gap"] = statistics.median(gaps)
            print(f"  client gap per token ruvllm / llama-server, {kind}: {pair_ratios[f'{kind}_gap']:.2f}x "
                  "(median of per-prompt ratios)")
    out = out_dir / "ttft.json"
    out.write_text(json.dumps({
        "benchmark": "llamacpp_ttft", "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {**machine_info(), "load_avg_before": load_before, "load_avg_after": load_after},
        "prompt_length": args.prompt_length, "requests": args.requests, "n_predict": args.n_predict,
        "threads": args.threads, "ruvllm_cmd": ruv_cmd, "llama_server_cmd": peer_cmd,
        "median": medians, "median_pair_ratio": pair_ratios, "per_request": rows,
    }, indent=2))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
