"""Every backend on the same workload, one after another in one run: single-stream decode and
aggregate throughput at C concurrent requests through the ServingEngine.

    .venv/bin/python benchmarks/backends_side_by_side.py
    .venv/bin/python benchmarks/backends_side_by_side.py --backends llamacpp,candle_like:dtype=bfloat16

Each backend runs in its own ``ruvllm benchmark --mode both`` process (engine libraries never
share a process, and each gets the machine alone), with the same prompt length, generation
length and concurrency levels. Prints one table (single-stream decode tok/s, aggregate tok/s
per level, the C_max / single-stream ratio, TTFT p50 at C_max) and writes
``benchmarks/results/side_by_side/{summary.json,throughput.png}`` plus each backend's own
benchmark.json/csv. Run it on an otherwise idle machine: the figures are only comparable
within one run.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table
from ruvllm.bench import report as rep

DEFAULT_BACKENDS = "llamacpp,candle_like:dtype=bfloat16,mlx,mistralrs"
RESULTS = Path(__file__).parent / "results" / "side_by_side"


def parse_spec(spec: str) -> tuple[str, list[str]]:
    """``name:key=value,key=value`` -> (name, ["key=value", ...])."""
    name, _, opts = spec.partition(":")
    return name, [o for o in opts.split(";") if o]


def run_backend(spec: str, args: argparse.Namespace, console: Console) -> dict:
    name, options = parse_spec(spec)
    label = name if not options else f"{name} ({', '.join(options)})"
    out = RESULTS / spec.replace(":", "_").replace("=", "-").replace(";", "_")
    cmd = [sys.executable, "-m", "ruvllm", "benchmark", "--backend", name, "--mode", "both",
           "--label", label, "--warmup", "1", "--iterations", str(args.iterations),
           "--prompt-length", str(args.prompt_length), "--gen-length", str(args.gen_length),
           "--concurrency", args.concurrency, "--output-dir", str(out), "--format", "json"]
    for option in options:
        cmd += ["--option", option]
    console.print(f"[bold]{label}[/]: {' '.join(cmd[1:])}")
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
    if done.returncode != 0:
        console.print(f"[red]{label} failed (exit {done.returncode}); skipped[/]")
        return {"label": label, "failed": done.returncode}
    result = json.loads((out / "benchmark.json").read_text())
    result["label"] = label
    return result


def summary_table(results: list[dict], levels: list[int]) -> Table:
    top = max(levels)
    table = Table(title="backends side by side (tok/s; ratio = aggregate at the top level / single stream)")
    for col in ("backend", "single-stream decode", *(f"C={c}" for c in levels), "ratio",
                f"TTFT p50 C={top} (s)"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in results:
        if "failed" in r:
            table.add_row(r["label"], "failed", *([""] * (len(levels) + 2)))
            continue
        single = r["single"]["decode_tok_s"]["p50"]
        by_level = {s["concurrency"]: s for s in r["serving"]}
        agg = [by_level[c]["output_tok_s"] if c in by_level else float("nan") for c in levels]
        ttft = by_level[top]["ttft_s"]["p50"] if top in by_level else float("nan")
        table.add_row(r["label"], f"{single:.1f}", *(f"{a:.1f}" for a in agg),
                      f"{agg[-1] / single:.2f}x", f"{ttft:.2f}")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=DEFAULT_BACKENDS,
                    help="comma-separated NAME[:key=value;key=value] (default: %(default)s)")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()
    console = Console(width=160)
    levels = sorted(int(c) for c in args.concurrency.split(","))
    results = [run_backend(spec, args, console) for spec in args.backends.split(",")]
    ok = [r for r in results if "failed" not in r]
    if ok:
        m = ok[0]["machine"]
        console.print(f"{m['cpu']} x{m['logical_cpus']} | load at start of each run: "
                      + ", ".join(f"{r['label']} {r['machine']['load_average_1m']}" for r in ok))
    console.print(summary_table(results, levels))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "summary.json").write_text(rep.to_json({"levels": levels, "results": results}))
    series = [s for r in ok for s in r["serving"]]
    if series:
        path = rep.plot(series, RESULTS / "throughput.png", title="ruvllm backends, embedded model")
        console.print(f"plot: {path}")


if __name__ == "__main__":
    main()
