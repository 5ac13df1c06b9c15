"""Every backend on the same workload, one after another in one run: single-stream decode and
aggregate throughput at C concurrent requests through the ServingEngine.

    .venv/bin/python benchmarks/backends_side_by_side.py
    .venv/bin/python benchmarks/backends_side_by_side.py --backends llamacpp,candle_like:dtype=bfloat16

Each measurement is its own ``ruvllm benchmark`` process (engine libraries never share a
process, and each gets the machine alone), with the same prompt length and generation length:
the single-stream run, then each concurrency level C as one wave of C simultaneous requests.
Prints one table (single-stream decode tok/s, aggregate tok/s per level, the decode rate
at C_max (C_max / ITL p50) and its ratio to the single stream, TTFT p50 at C_max) and writes
``benchmarks/results/side_by_side/{summary.json,throughput.png}`` plus each run's own
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
from ruvllm.bench.machine import machine_line

DEFAULT_BACKENDS = "llamacpp,candle_like:dtype=bfloat16,mlx,mistralrs"
RESULTS = Path(__file__).parent / "results" / "side_by_side"


def parse_spec(spec: str) -> tuple[str, list[str]]:
    """``name:key=value,key=value`` -> (name, ["key=value", ...])."""
    name, _, opts = spec.partition(":")
    return name, [o for o in opts.split(";") if o]


def _bench(args: argparse.Namespace, name: str, options: list[str], label: str, out: Path,
           *extra: str) -> dict | None:
    cmd = [sys.executable, "-m", "ruvllm", "benchmark", "--backend", name, "--label", label,
           "--prompt-length", str(args.prompt_length), "--gen-length", str(args.gen_length),
           "--output-dir", str(out), "--format", "json", *extra]
    for option in options:
        cmd += ["--option", option]
    if subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False).returncode != 0:
        return None
    return json.loads((out / "benchmark.json").read_text())


def run_backend(spec: str, args: argparse.Namespace, levels: list[int], console: Console) -> dict:
    """Single stream, then each level as one wave of C concurrent requests (C requests), each
    in a fresh process."""
    name, options = parse_spec(spec)
    label = name if not options else f"{name} ({', '.join(options)})"
    out = RESULTS / spec.replace(":", "_").replace("=", "-").replace(";", "_")
    console.print(f"[bold]{label}[/]")
    single = _bench(args, name, options, label, out / "single", "--mode", "single", "--warmup", "1",
                    "--iterations", str(args.iterations))
    if single is None:
        console.print(f"[red]{label}: single-stream run failed; skipped[/]")
        return {"label": label, "failed": True}
    result = {"label": label, "machine": single["machine"], "single": single["single"], "serving": []}
    for c in levels:
        level = _bench(args, name, options, label, out / f"c{c}", "--mode", "serving", "--concurrency",
                       str(c), "--num-requests", str(c))
        if level is None:
            console.print(f"[red]{label}: C={c} failed[/]")
            continue
        result["serving"] += level["serving"]
        console.print(f"  C={c}: {level['serving'][0]['output_tok_s']:.1f} tok/s "
                      f"(load {level['machine']['load_average_1m']})")
    return result


def summary_table(results: list[dict], levels: list[int]) -> Table:
    top = max(levels)
    table = Table(title=f"backends side by side, tok/s (aggregate at C includes prefill; decode C={top} "
                        f"= {top} / ITL p50, the rate of a step in which all {top} decode together)")
    for col in ("backend", "single-stream decode", *(f"C={c}" for c in levels), f"decode C={top}",
                "decode ratio", f"TTFT p50 C={top} (s)"):
        table.add_column(col, justify="left" if col == "backend" else "right")
    for r in results:
        if "failed" in r:
            table.add_row(r["label"], "failed", *([""] * (len(levels) + 3)))
            continue
        single = r["single"]["decode_tok_s"]["p50"]
        by_level = {s["concurrency"]: s for s in r["serving"]}
        agg = [by_level[c]["output_tok_s"] if c in by_level else float("nan") for c in levels]
        ttft = by_level[top]["ttft_s"]["p50"] if top in by_level else float("nan")
        # Not TPOT: a request's TPOT also counts the steps that prefilled the wave's later
        # prompts, while the median gap between two tokens is a step where all decode.
        decode = top / by_level[top]["itl_s"]["p50"] if top in by_level else float("nan")
        table.add_row(r["label"], f"{single:.1f}", *(f"{a:.1f}" for a in agg), f"{decode:.1f}",
                      f"{decode / single:.2f}x", f"{ttft:.2f}")
    return table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default=DEFAULT_BACKENDS,
                    help="comma-separated NAME[:key=value;key=value] (default: %(default)s)")
    ap.add_argument("--concurrency", default="1,4,16")
    ap.add_argument("--prompt-length", type=int, default=128)
    ap.add_argument("--gen-length", type=int, default=64)
    ap.add_argument("--iterations", type=int, default=3)
    args = ap.parse_args()
    console = Console(width=160)
    console.print(machine_line(), markup=False, highlight=False, soft_wrap=True)
    levels = sorted(int(c) for c in args.concurrency.split(","))
    results = [run_backend(spec, args, levels, console) for spec in args.backends.split(",")]
    ok = [r for r in results if "failed" not in r]
    if ok:
        console.print("load at start of each run: "
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
