"""``ruvllm serve`` against the servers CPU users pick: llama.cpp's own ``llama-server`` and
``python -m llama_cpp.server``; same model, same clients, same machine.

It prints issue 59's table: for each prompt length of ``--prompt-length`` (the issue's: 64 and
550 tokens, ``--prompt-length 64,550``) and each level of ``--clients`` (its 1, 4, 16, 32
concurrent streaming clients), every server's output tok/s and TTFT p50 and each one's ratio to
llama-server, as markdown (also written to ``compare_servers.md``), beside JSON, CSV and a plot
with a row of panels per prompt length. Each server runs alone (started, measured, stopped in
turn); for each prompt length it answers two warm-up requests, then every level, measured by
ruvllm's serving benchmark (client-side timing). Every request, warm-ups included, has a prompt
of its own that shares no first token with any other (``ruvllm.bench.prompts.fresh_prompts``):
llama-server's prompt cache reuses a common head token by token, so prompts that differed only
in a number, or a level that resent the warm-up's or the level before's prompts, measured its
cache. Every request asks for ``--gen-length`` tokens with EOS suppressed (``ignore_eos`` for
ruvllm and llama-server, a ``logit_bias`` of -100 on the EOS ids for llama-cpp-python, which has
no ``ignore_eos``), so a request that returns fewer tokens was cut short by the server.

llama-server (built by benchmarks/build_llama_server.py, ``make peers``, from the llama.cpp
source of the installed llama-cpp-python with the llamacpp backend's cmake options for this CPU,
so both run the same kernels; the table's caption names the build) runs as its users run it for
many clients: ``--parallel`` = the most clients measured, continuous batching, unified KV
(``--kv-unified``) of the same number of cells as ruvllm's llamacpp pool (its ``kv_budget_mib``,
so both hold the same KV memory), the same threads, flash attention at its default (auto: on, on
a CPU). llama_cpp.server (``--peers llama_cpp.server``) runs with its default settings and a
second time with ``--interrupt_requests False`` (its setting that lets every stream finish:
requests are then served one after another).

``--model`` serves another model than the embedded one (a reference or a GGUF path) from every
server. ``--backends`` serves the same model with several ruvllm backends in turn, one line each in the
table and the plot; ``-o BACKEND:KEY=VALUE`` passes a backend option to one of them, and
``--variant 'BACKEND:FLAGS'`` adds one more run of a backend with other serve flags (say, as
llama-server is run: ``'llamacpp:--max-concurrent 32 -o flash_attn=auto'``);
``--peer-variant 'llama-server:FLAGS'`` does the same for llama-server (say, its speculation:
``'llama-server:--spec-type ngram-simple'``). ``--workload grounded`` sends the input-grounded
completions of benchmarks/speculative.py (copy a text, rename a function; few, so taken in turn,
labelled with their median length) instead of synthetic prompts of ``--prompt-length`` tokens;
each server's drafted and accepted tokens (ruvllm's ``/metrics``, llama-server's ``draft
acceptance`` log lines, warm-up included) are printed with its tok/s and its ratio over the first
configuration of the same server. ``--repeats N`` (N > 1) starts every server at once and
measures them in turn, the order rotating each repeat and every repeat with prompts of its own,
so that on a loaded machine every server meets the same load (medians and per-repeat ratios
printed). Defaults:
llamacpp gets ``n_threads=--threads`` (everything else as ``ruvllm serve`` sets it: the 256 MiB
pool, the model's context); every other backend runs its own defaults (candle_like: ``dtype=auto``,
bfloat16 where the CPU has native bf16 and float32 elsewhere, and in float32 the GGUF's own blocks
where its native kernel runs). Every option given is named in the target's label.

    make peers                                                      # once (~17 min on 2 cores)
    .venv/bin/python benchmarks/compare_servers.py                  # writes benchmarks/results/
    .venv/bin/python benchmarks/compare_servers.py --clients 1,4,16,32 --prompt-length 64,550 \
        --backends llamacpp,candle_like                             # issue 59's table
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
from ruvllm.bench.machine import kind_label, machine_info, machine_line
from ruvllm.bench.prompts import fresh_prompts
from ruvllm.bench.serving import EachPromptOnce, HttpTarget, sweep, sweep_requests
from ruvllm.llm import LLM

ROOT = Path(__file__).resolve().parent
#: Requests each server answers (prompts of the same length, 4 tokens each) before a sweep measures.
WARMUP = 2


def backend_options(backends: list[str], given: list[str], threads: int) -> dict[str, dict[str, str]]:
    """Each backend's ``-o`` options: the defaults above, overridden by ``BACKEND:KEY=VALUE``."""
    opts: dict[str, dict[str, str]] = {
        b: dict({"llamacpp": {"n_threads": str(threads)}}.get(b, {}))
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


def requests_at(clients: int, min_requests: int) -> int:
    """Requests measured at one level: at least two per client."""
    return max(min_requests, 2 * clients)


def prompts_per_sweep(levels: list[int], min_requests: int) -> int:
    """Prompts one sweep of a server sends, its warm-up's and every level's, each once."""
    return sweep_requests(levels, lambda c: requests_at(c, min_requests), WARMUP)


async def measure(url: str, name: str, prompts: list[str], length: int, extra_body: dict, args, *,
                  once: bool) -> list[dict]:
    """One sweep over ``--clients``; ``once``: every request, the warm-up's included, sends a prompt
    of ``prompts`` no request before it sent (else they are taken in turn, as the grounded workload's
    few are)."""
    levels = [int(c) for c in args.clients.split(",")]
    console = Console(stderr=True)

    def measured(result: dict) -> None:
        failed = f", {result['failed']} failed" if result["failed"] else ""
        ttft = seconds(result["ttft_s"]["p50"])
        console.print(f"  {name}: {length}-token prompts, {result['concurrency']} clients: "
                      f"{result['output_tok_s']:.1f} tok/s, TTFT p50 {ttft}{failed}")

    async with HttpTarget(url, prompts, extra_body=extra_body, name=name) as target:
        return await sweep(EachPromptOnce(target) if once else target, levels,
                           num_requests=lambda c: requests_at(c, args.min_requests),
                           max_tokens=args.gen_length, prompt_length=length, warmup=WARMUP, measured=measured)


def seconds(value: float | None) -> str:
    """A time as the table shows it: three decimals below 0.1 s, one from 10 s."""
    if value is None:
        return "-"
    return f"{value:.3f} s" if value < 0.1 else f"{value:.2f} s" if value < 10 else f"{value:.1f} s"


def load_table(results: list[dict]) -> str:
    """Issue 59's table in markdown: a row per prompt length and client count (the shorter prompts
    first), a column per server (the first llama-server configuration first, the rest as measured).
    Each cell: output tok/s, its ratio to that llama-server (the median of the per-repeat ratios;
    medians of tok/s and TTFT p50 over repeats), and the TTFT p50; a level the server did not answer
    in full says so (llama-server fails every running request once its unified KV is full)."""
    targets = list(dict.fromkeys(r["target"] for r in results))
    baseline = next((t for t in targets if t.startswith("llama-server")), None)
    if baseline is not None:
        targets.remove(baseline)
        targets.insert(0, baseline)
    runs: dict[tuple[int, int, str], list[dict]] = {}
    for r in results:
        runs.setdefault((r["prompt_length"], r["concurrency"], r["target"]), []).append(r)
    lines = ["| load | " + " | ".join(targets) + " |", "|---" * (len(targets) + 1) + "|"]
    for length, clients in sorted({(r["prompt_length"], r["concurrency"]) for r in results}):
        cells = [f"C={clients}, {length}-token prompts"]
        for target in targets:
            mine = runs.get((length, clients, target), [])
            base = {r.get("repeat"): r for r in runs.get((length, clients, baseline), [])}
            cells.append(load_cell(mine, [] if target == baseline else
                                   [(r, base[r.get("repeat")]) for r in mine if r.get("repeat") in base]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_cell(mine: list[dict], pairs: list[tuple[dict, dict]]) -> str:
    """One server's cell of :func:`load_table`: ``pairs`` are its runs beside the baseline's."""
    if not mine:
        return "-"
    answered, asked = sum(r["completed"] for r in mine), sum(r["num_requests"] for r in mine)
    if not answered:
        return f"**0 of {asked} answered**"
    text = f"{statistics.median(r['output_tok_s'] for r in mine):.1f}"
    if ratios := [r["output_tok_s"] / b["output_tok_s"] for r, b in pairs if b["output_tok_s"]]:
        text += f", {statistics.median(ratios):.2f}x"
    ttfts = [r["ttft_s"]["p50"] for r in mine if r["ttft_s"]["p50"] is not None]
    text += f" ({seconds(statistics.median(ttfts) if ttfts else None)})"
    if answered < asked:
        text += f", {answered} of {asked} answered"
    if cut := sum(r["cut_short"] for r in mine):
        text += f", {cut} cut short"
    return text


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


def llama_server_build(binary: Path) -> str:
    """What the llama-server binary is: build_llama_server.py's (``make peers``) for this CPU, with
    the llamacpp backend's cmake options, or one given with ``--llama-server``."""
    from importlib.metadata import version

    from ruvllm_llamacpp.native_build import planned

    if binary != default_llama_server():
        return f"{binary} (--llama-server: its build is not checked here)"
    build, _ = planned(version("llama-cpp-python"))
    return (f"{binary.parent.name} (make peers: llama-cpp-python {version('llama-cpp-python')}'s llama.cpp, "
            f"the llamacpp backend's cmake options {' '.join(build.cmake_args)})")


def run_server(cmd: list[str], url: str, log: Path) -> subprocess.Popen:
    fh = log.open("w")
    proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env={**os.environ})
    wait_ready(url, proc)
    return proc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", default="1,4,16", help="client levels, comma-separated")
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--model", default=None,
                    help="a model reference or GGUF path for every server (default: the embedded model)")
    ap.add_argument("--prompt-length", default="64",
                    help="prompt lengths in tokens, comma-separated: each is a sweep over --clients, every "
                         "request with a prompt of its own (issue 59's short and long: 64,550)")
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
    lengths = sorted({int(n) for n in args.prompt_length.split(",")})
    per_sweep = prompts_per_sweep(levels, args.min_requests)
    with LLM(backend="llamacpp", model=args.model) as llm:
        model_path = llm.info.path
        eos_ids = llm.info.special_tokens.eos_ids
        if args.workload == "grounded":  # its few prompts, in turn; labelled by their median length
            from speculative import GROUNDED

            median = statistics.median(len(llm.tokenizer.encode(p)) for p in GROUNDED)
            workloads = {round(median): list(GROUNDED)}
        else:  # every request of every sweep (each length, each repeat) a prompt of its own
            count = per_sweep * args.repeats
            every = fresh_prompts(llm.tokenizer, [n for n in lengths for _ in range(count)])
            workloads = {n: every[i * count:(i + 1) * count] for i, n in enumerate(lengths)}
        model_name = llm.info.name
        cells = pool_cells(llm.backend, max(levels), args.kv_budget_mib)
    bin_dir = Path(sys.executable).parent
    peer_build = llama_server_build(llama_server) if "llama-server" in peers else "not run"

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
               "--log-level", "warning", *(["--model", args.model] if args.model else [])]
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

    once = args.workload == "synthetic"

    def sweeps(url: str, name: str, body: dict, turn: int) -> list[dict]:
        """Every prompt length's sweep of one server, with the prompts of repeat ``turn``."""
        out = []
        for length, prompts in workloads.items():
            mine = prompts[turn * per_sweep:(turn + 1) * per_sweep] if once else prompts
            out += asyncio.run(measure(url, name, mine, length, body, args, once=once))
        return out

    results: list[dict] = []
    drafts: dict[str, tuple[int, int]] = {}
    load_before = os.getloadavg()
    if args.repeats == 1:  # one server at a time, alone on the machine
        for kind, settings, cmd, url, log, body in servers:
            proc, name = start(kind, settings, cmd, url, log)
            try:
                results += sweeps(url, name, body, 0)
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
                    for r in sweeps(servers[i][3], names[i], servers[i][5], turn):
                        results.append({**r, "repeat": turn})
            for (kind, _, _, url, log, _), name in zip(servers, names, strict=True):
                drafts[name] = speculation(kind, url, log)
        finally:
            for proc in procs:
                stop(proc)

    report = {"machine": machine_info(), "model": model_name, "serving": results,
              "drafts": {name: {"drafted": d, "accepted": a} for name, (d, a) in drafts.items()},
              "settings": {"clients": args.clients, "gen_length": args.gen_length,
                           "prompt_lengths": list(workloads), "threads": args.threads,
                           "backends": options, "variants": args.variant,
                           "peer_variants": args.peer_variant, "workload": args.workload,
                           "peers": sorted(peers), "llama_server": peer_build,
                           "load_average_before": load_before, "load_average": os.getloadavg()}}
    m = report["machine"]
    table = "\n".join([
        f"{model_name}, {args.gen_length} new tokens, {', '.join(map(str, workloads))}-token prompts "
        f"({args.workload}), threads {args.threads}; machine: {kind_label(m)}, {m['cpu']} "
        f"x{m['logical_cpus']}; load average {load_before[0]:.1f} before, {os.getloadavg()[0]:.1f} after; "
        f"llama-server: {peer_build}",
        "Each cell: output tok/s, its ratio to the llama-server column (TTFT p50).", "",
        load_table(results)])
    report["table"] = table
    (args.output_dir / "compare_servers.json").write_text(rep.to_json(report))
    (args.output_dir / "compare_servers.csv").write_text(rep.to_csv(report))
    (args.output_dir / "compare_servers.md").write_text(table + "\n")
    rep.plot(results, args.output_dir / "compare_servers.png",
             title=f"{model_name} | {kind_label(m)}: {m['cpu']} x{m['logical_cpus']}")
    rep.print_tables(report, Console(width=200))
    print(machine_line())
    print(table)

    def kind(r: dict) -> str:
        return r["target"].split(" (")[0]

    first: dict[str, str] = {}  # each kind of server's first configuration (as listed, not as run)
    for name in drafts:
        first.setdefault(kind({"target": name}), name)
    by_side: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for r in results:  # each run over its kind's first configuration (same load and repeat)
        base = next(b for b in results if b["target"] == first[kind(r)]
                    and (b["prompt_length"], b["concurrency"], b.get("repeat"))
                    == (r["prompt_length"], r["concurrency"], r.get("repeat")))
        if base["output_tok_s"]:
            by_side.setdefault((r["target"], r["prompt_length"], r["concurrency"]), []).append(
                (r["output_tok_s"], r["output_tok_s"] / base["output_tok_s"]))
    if len(first) == len(drafts) and not any(d for d, _ in drafts.values()):
        by_side = {}  # one configuration of each server, nothing drafted: the table said it all
    for (target, length, c), figures in by_side.items():
        drafted, accepted = drafts.get(target, (0, 0))
        kept = f"{accepted} of {drafted} drafted kept" if drafted else "nothing drafted"
        print(f"{c:>3} clients, {length}-token prompts: {target}: "
              f"{statistics.median(t for t, _ in figures):.1f} tok/s, "
              f"x{statistics.median(x for _, x in figures):.2f} of {kind({'target': target})}'s first run "
              f"(median of {', '.join(f'{x:.2f}' for _, x in figures)}); {kept} (whole run, warm-ups in)")
    print(json.dumps({"written": str(args.output_dir)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
