"""``ruvllm serve`` against the servers CPU users pick: llama.cpp's own ``llama-server`` and
``python -m llama_cpp.server``; same model, same clients, same machine.

Each server runs alone (started, measured, stopped in turn), is warmed up, then measured with
1, 4 and 16 concurrent streaming clients by ruvllm's serving benchmark (client-side timing).
Every request asks for ``--gen-length`` tokens with EOS suppressed (``ignore_eos`` for ruvllm
and llama-server, a ``logit_bias`` of -100 on the EOS ids for llama-cpp-python, which has no
``ignore_eos``), so a request that returns fewer tokens was cut short by the server.

llama-server (built by benchmarks/build_llama_server.py from the llama.cpp source of the
installed llama-cpp-python, so both run the same kernels) runs as its users run it for many
clients: ``--parallel`` = the most clients measured, continuous batching, unified KV
(``--kv-unified``) of the same number of cells as ruvllm's llamacpp pool (its ``kv_budget_mib``,
so both hold the same KV memory), the same threads, flash attention at its default (auto: on, on
a CPU). llama_cpp.server (``--peers llama_cpp.server``) runs with its default settings and a
second time with ``--interrupt_requests False`` (its setting that lets every stream finish:
requests are then served one after another).

``--backends`` serves the same model with several ruvllm backends in turn, one line each in the
table and the plot; ``-o BACKEND:KEY=VALUE`` passes a backend option to one of them, and
``--variant 'BACKEND:FLAGS'`` adds one more run of a backend with other serve flags (say, as
llama-server is run: ``'llamacpp:--max-concurrent 32 -o flash_attn=auto'``);
``--peer-variant 'llama-server:FLAGS'`` does the same for llama-server (say, its speculation:
``'llama-server:--spec-type ngram-simple'``). ``--workload grounded`` sends the input-grounded
completions of benchmarks/speculative.py (copy a text, rename a function) instead of synthetic
prompts of ``--prompt-length`` tokens; each server's drafted and accepted tokens (ruvllm's
``/metrics``, llama-server's ``draft acceptance`` log lines, warm-up included) are printed with
its tok/s and its ratio over the first configuration of the same server. ``--repeats N`` (N > 1)
starts every server at once and measures them in turn, the order rotating each repeat, so that on
a loaded machine every server meets the same load (medians and per-repeat ratios printed). Defaults:
llamacpp gets ``n_threads=--threads`` (everything else as ``ruvllm serve`` sets it: the 256 MiB
pool, the model's context); candle_like gets ``dtype=bfloat16``, in which it batches well on
CPUs with bf16 matrix instructions (on one without, say ``-o candle_like:dtype=float32``). Every
option is named in the target's label.

    .venv/bin/python benchmarks/build_llama_server.py               # once (~17 min on 2 cores)
    .venv/bin/python benchmarks/compare_servers.py                  # writes benchmarks/results/
    .venv/bin/python benchmarks/compare_servers.py --clients 1,4,16,32 --prompt-length 512 \
        --backends llamacpp,candle_like --peers llama-server,llama_cpp.server
    .venv/bin/python benchmarks/compare_servers.py --workload grounded --clients 1 --backends llamacpp \
        --variant "llamacpp:--speculative-config '{\"method\": \"ngram\"}'" \
        --peer-variant 'llama-server:--spec-type ngram-simple'
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
from rich.console import Console
from ruvllm.bench import report as rep
from ruvllm.bench.machine import machine_info
from ruvllm.bench.prompts import prompt_text
from ruvllm.bench.serving import HttpTarget, sweep
from ruvllm.llm import LLM

ROOT = Path(__file__).resolve().parent


def backend_options(backends: list[str], given: list[str], threads: int) -> dict[str, dict[str, str]]:
    """Each backend's ``-o`` options: the defaults above, overridden by ``BACKEND:KEY=VALUE``."""
    opts: dict[str, dict[str, str]] = {
        b: dict({"llamacpp": {"n_threads": str(threads)},
                 "candle_like": {"dtype": "bfloat16"}}.get(b, {}))
        for b in backends}
    for item in given:
        backend, sep, kv = item.partition(":")
        key, eq, value = kv.partition("=")
        if not sep or not eq or not key:
            raise SystemExit(f"-o {item!r}: expected BACKEND:KEY=VALUE, e.g. candle_like:dtype=bfloat16")
        if backend not in opts:
            raise SystemExit(f"-o {item!r}: {backend!r} is not one of --backends {','.join(backends)}")
        opts[backend][key] = value
    return opts


def parse_variant(text: str, options: dict[str, dict[str, str]]) -> tuple[str, list[str]]:
    """``BACKEND:FLAGS`` -> (backend, serve flags): one more run of a backend of --backends."""
    backend, sep, flags = text.partition(":")
    if not sep or backend not in options:
        raise SystemExit(f"--variant {text!r}: expected BACKEND:FLAGS with BACKEND one of --backends "
                         f"{','.join(options)}")
    return backend, shlex.split(flags)


def parse_peer_variant(text: str) -> list[str]:
    """``llama-server:FLAGS`` -> the extra llama-server flags."""
    peer, sep, flags = text.partition(":")
    if not sep or peer != "llama-server":
        raise SystemExit(f"--peer-variant {text!r}: expected 'llama-server:FLAGS'")
    return shlex.split(flags)


def ruvllm_drafts(url: str) -> tuple[int, int]:
    """(drafted, accepted) tokens so far, from ruvllm's ``/metrics``."""
    text = httpx.get(url + "/metrics").text
    found = {name: int(float(value)) for name, value in
             re.findall(r"^ruvllm:spec_decode_num_(draft|accepted)_tokens_total(?:\{[^}]*\})? (\S+)$", text,
                        re.MULTILINE)}
    return found.get("draft", 0), found.get("accepted", 0)


def llama_server_drafts(log: Path) -> tuple[int, int]:
    """(drafted, accepted) tokens, summed over llama-server's ``draft acceptance`` log lines (one
    per finished request that drafted)."""
    pairs = re.findall(r"draft acceptance = \S+ \(\s*(\d+) accepted /\s*(\d+) generated\)", log.read_text())
    return sum(int(g) for _, g in pairs), sum(int(a) for a, _ in pairs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with code {proc.returncode} before it was ready")
        try:
            if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"server at {url} not ready after {timeout:.0f} s")


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


async def measure(url: str, name: str, prompts: list[str], extra_body: dict, args) -> list[dict]:
    levels = [int(c) for c in args.clients.split(",")]
    console = Console(stderr=True)

    def progress(c: int, done: int, total: int) -> None:
        if done == total:
            console.print(f"  {name}: {c} clients done")

    async with HttpTarget(url, prompts, extra_body=extra_body, name=name) as target:
        return await sweep(target, levels, num_requests=lambda c: max(args.min_requests, 2 * c),
                           max_tokens=args.gen_length, prompt_length=args.prompt_length, warmup=2,
                           progress=progress)


def pool_cells(backend, sequences: int, kv_budget_mib: int) -> int:
    """The cells of ruvllm's llamacpp pool for this model under ``kv_budget_mib``: the KV memory
    llama-server is given too."""
    from ruvllm_llamacpp.kv_pool import plan_pool

    return plan_pool(n_ctx=backend.n_ctx, sequences=sequences, bytes_per_token=backend.kv_bytes_per_token,
                     budget_mib=kv_budget_mib).tokens


def default_llama_server() -> Path | None:
    """The binary benchmarks/build_llama_server.py built for the installed llama-cpp-python."""
    from importlib.metadata import version

    from build_llama_server import binary_path

    path = binary_path(version("llama-cpp-python"))
    return path if path.exists() else None


def run_server(cmd: list[str], url: str, log: Path) -> subprocess.Popen:
    fh = log.open("w")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ})
    wait_ready(url, proc)
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,4,16")
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--prompt-length", type=int, default=64)
    ap.add_argument("--min-requests", type=int, default=4, help="requests per level: max(this, 2 x clients)")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--output-dir", type=Path, default=ROOT / "results")
    ap.add_argument("--backends", default="llamacpp,candle_like",
                    help="ruvllm backends to serve in turn, comma-separated (e.g. llamacpp,candle_like)")
    ap.add_argument("-o", "--option", action="append", default=[], metavar="BACKEND:KEY=VALUE",
                    help="backend option for one of --backends (repeatable), e.g. candle_like:dtype=float32")
    ap.add_argument("--peers", default="llama-server",
                    help="peer servers, comma-separated: llama-server, llama_cpp.server (or none)")
    ap.add_argument("--llama-server", type=Path, default=None,
                    help="llama-server binary (default: the one build_llama_server.py built)")
    ap.add_argument("--variant", action="append", default=[], metavar="BACKEND:FLAGS",
                    help="one more ruvllm serve run of BACKEND with these serve flags (repeatable), e.g. "
                         "'llamacpp:--max-concurrent 32 -o flash_attn=auto' (llama-server's settings)")
    ap.add_argument("--peer-variant", action="append", default=[], metavar="llama-server:FLAGS",
                    help="one more llama-server run with these extra flags (repeatable), e.g. "
                         "'llama-server:--spec-type ngram-simple --spec-ngram-simple-size-m 8'")
    ap.add_argument("--workload", choices=["synthetic", "grounded"], default="synthetic",
                    help="synthetic: prompts of --prompt-length tokens; grounded: the completions of "
                         "benchmarks/speculative.py that copy their input")
    ap.add_argument("--repeats", type=int, default=1,
                    help="above 1: every server is started at once and measured in turn, the order rotating "
                         "each repeat (on a loaded machine, every server meets the same load); ratios are "
                         "per repeat")
    ap.add_argument("--kv-budget-mib", type=int, default=256,
                    help="KV memory of ruvllm's llamacpp pool and of llama-server's unified KV")
    args = ap.parse_args()
    peers = {p.strip() for p in args.peers.split(",") if p.strip() and p.strip() != "none"}
    if unknown := peers - {"llama-server", "llama_cpp.server"}:
        raise SystemExit(f"--peers: unknown {', '.join(sorted(unknown))}; use llama-server, llama_cpp.server")
    llama_server = args.llama_server or default_llama_server()
    if "llama-server" in peers and llama_server is None:
        raise SystemExit("no llama-server binary: run benchmarks/build_llama_server.py first (or pass "
                         "--llama-server PATH, or --peers llama_cpp.server)")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    args.output_dir.mkdir(parents=True, exist_ok=True)

    levels = [int(c) for c in args.clients.split(",")]
    with LLM(backend="llamacpp") as llm:
        model_path = llm.info.path
        eos_ids = llm.info.special_tokens.eos_ids
        if args.workload == "grounded":
            from speculative import GROUNDED

            prompts = list(GROUNDED)
        else:
            prompts = [prompt_text(llm.tokenizer, args.prompt_length, i) for i in range(64)]
        model_name = llm.info.name
        cells = pool_cells(llm.backend, max(levels), args.kv_budget_mib)
    bin_dir = Path(sys.executable).parent

    options = backend_options(backends, args.option, args.threads)
    # every server to measure: (kind, label settings, command, url, log, request body extras)
    servers: list[tuple[str, list[str], list[str], str, Path, dict]] = []
    runs = [(backend, []) for backend in backends] + [parse_variant(v, options) for v in args.variant]
    for n, (backend, flags) in enumerate(runs):
        opts = dict(options[backend])
        if backend == "llamacpp":
            opts.setdefault("kv_budget_mib", str(args.kv_budget_mib))
        url = f"http://127.0.0.1:{free_port()}"
        cmd = [str(bin_dir / "ruvllm"), "serve", "--backend", backend, "--port", url.rsplit(":", 1)[1],
               "--log-level", "warning"]
        for key, value in opts.items():
            cmd += ["-o", f"{key}={value}"]
        settings = [*(f"{k}={v}" for k, v in opts.items()), *([" ".join(flags)] if flags else [])]
        servers.append(("ruvllm serve", settings, [*cmd, *flags], url,
                        args.output_dir / f"ruvllm-serve-{backend}-{n}.log", {"ignore_eos": True}))
    peer_runs = [[], *(parse_peer_variant(v) for v in args.peer_variant)] if "llama-server" in peers else []
    for n, extra in enumerate(peer_runs):
        url = f"http://127.0.0.1:{free_port()}"
        flags = ["--parallel", str(max(levels)), "--ctx-size", str(cells), "--kv-unified",
                 "--threads", str(args.threads), "--threads-batch", str(args.threads), *extra]
        settings = [f"-np {max(levels)}", f"-c {cells}", "kv-unified", *([" ".join(extra)] if extra else [])]
        servers.append(("llama-server", settings, [str(llama_server), "--model", str(model_path), "--host",
                                                   "127.0.0.1", "--port", url.rsplit(":", 1)[1], *flags], url,
                        args.output_dir / (f"llama-server-{n}.log" if n else "llama-server.log"),
                        {"ignore_eos": True}))
    peer_settings = {"defaults": [], "interrupt_requests=False": ["--interrupt_requests", "False"]}
    bias = {str(t): -100 for t in eos_ids}
    for setting, extra in (peer_settings if "llama_cpp.server" in peers else {}).items():
        url = f"http://127.0.0.1:{free_port()}"
        servers.append(("llama_cpp.server", [setting],
                        [sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--port",
                         url.rsplit(":", 1)[1], "--n_threads", str(args.threads), "--n_ctx", "4096", *extra],
                        url,
                        args.output_dir / f"llama_cpp-server-{setting.replace('=', '-')}.log",
                        {"logit_bias": bias}))

    def start(kind: str, settings: list[str], cmd: list[str], url: str, log: Path
              ) -> tuple[subprocess.Popen, str]:
        print(f"{' '.join(cmd)} on {url}", file=sys.stderr)
        proc = run_server(cmd, url, log)
        if kind == "ruvllm serve":
            health = httpx.get(url + "/health").json()
            settings = [health["backend"], health["engine_path"], *settings]
        return proc, f"{kind} ({', '.join(settings)})"

    def speculation(kind: str, url: str, log: Path) -> tuple[int, int]:
        return ruvllm_drafts(url) if kind == "ruvllm serve" else (
            llama_server_drafts(log) if kind == "llama-server" else (0, 0))

    results: list[dict] = []
    drafts: dict[str, tuple[int, int]] = {}
    if args.repeats == 1:  # one server at a time, alone on the machine
        for kind, settings, cmd, url, log, body in servers:
            proc, name = start(kind, settings, cmd, url, log)
            try:
                results += asyncio.run(measure(url, name, prompts, body, args))
                if kind == "ruvllm serve":
                    drafts[name] = speculation(kind, url, log)
            finally:
                stop(proc)
            if kind != "ruvllm serve":
                drafts[name] = speculation(kind, url, log)
    else:  # every server up at once, measured in turn, the order rotating each repeat
        procs: list[subprocess.Popen] = []
        try:
            names = []
            for kind, settings, cmd, url, log, _ in servers:
                proc, name = start(kind, settings, cmd, url, log)
                procs.append(proc)
                names.append(name)
            for turn in range(args.repeats):
                order = list(range(len(servers)))
                order = order[turn % len(order):] + order[:turn % len(order)]
                for i in order:
                    for r in asyncio.run(measure(servers[i][3], names[i], prompts, servers[i][5], args)):
                        results.append({**r, "repeat": turn})
            for (kind, _, _, url, log, _), name in zip(servers, names, strict=True):
                drafts[name] = speculation(kind, url, log)
        finally:
            for proc in procs:
                stop(proc)

    report = {"machine": machine_info(), "model": model_name, "serving": results,
              "drafts": {name: {"drafted": d, "accepted": a} for name, (d, a) in drafts.items()},
              "settings": {"clients": args.clients, "gen_length": args.gen_length,
                           "prompt_length": args.prompt_length, "threads": args.threads,
                           "backends": options, "variants": args.variant,
                           "peer_variants": args.peer_variant, "workload": args.workload,
                           "peers": sorted(peers),
                           "load_average": os.getloadavg()}}
    (args.output_dir / "compare_servers.json").write_text(rep.to_json(report))
    (args.output_dir / "compare_servers.csv").write_text(rep.to_csv(report))
    rep.plot(results, args.output_dir / "compare_servers.png",
             title=f"{model_name} | {report['machine']['cpu']} x{report['machine']['logical_cpus']}")
    rep.print_tables(report, Console(width=200))
    ours = [r for r in results if r["target"].startswith("ruvllm")]
    peers = [r for r in results if not r["target"].startswith("ruvllm")]
    for r in ours:
        for b in peers:
            if b["concurrency"] != r["concurrency"] or b.get("repeat") != r.get("repeat"):
                continue
            # A server that answered nothing at a level (llama-server fails every running request
            # once its unified KV is full) has no ratio: say what it did instead.
            ratio = (f"x{r['output_tok_s'] / b['output_tok_s']:.2f}" if b["output_tok_s"]
                     else f"it answered none, {b['failed']} failed")
            print(f"{r['concurrency']:>3} clients: {r['target']} {r['output_tok_s']:.1f} tok/s vs "
                  f"{b['target']} {b['output_tok_s']:.1f} ({ratio}); TTFT p50 "
                  f"{r['ttft_s']['p50']:.2f} s vs {b['ttft_s']['p50']:.2f} s; "
                  f"cut short {r['cut_short']} vs {b['cut_short']}")
    def kind(r: dict) -> str:
        return r["target"].split(" (")[0]

    first: dict[str, str] = {}  # each kind of server's first configuration (as listed, not as run)
    for name in drafts:
        first.setdefault(kind({"target": name}), name)
    by_side: dict[tuple[str, int], list[tuple[float, float]]] = {}
    for r in results:  # each run over its kind's first configuration (same concurrency and repeat)
        base = next(b for b in results if b["target"] == first[kind(r)]
                    and b["concurrency"] == r["concurrency"] and b.get("repeat") == r.get("repeat"))
        if base["output_tok_s"]:
            by_side.setdefault((r["target"], r["concurrency"]), []).append(
                (r["output_tok_s"], r["output_tok_s"] / base["output_tok_s"]))
    for (target, c), figures in by_side.items():
        drafted, accepted = drafts.get(target, (0, 0))
        kept = f"{accepted} of {drafted} drafted kept" if drafted else "nothing drafted"
        print(f"{c:>3} clients: {target}: {statistics.median(t for t, _ in figures):.1f} tok/s, "
              f"x{statistics.median(x for _, x in figures):.2f} of {kind({'target': target})}'s first run "
              f"(median of {', '.join(f'{x:.2f}' for _, x in figures)}); {kept} (whole run, warm-ups in)")
    print(json.dumps({"written": str(args.output_dir)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
