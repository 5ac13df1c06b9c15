"""Benchmark output: a rich table, JSON, CSV and a PNG plot (one line per target).

The JSON is the complete record (machine, versions, every per-level aggregate); the table, CSV
and plot are views of it, so a plot can be redrawn later from saved JSON files.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ruvllm.bench.machine import kind_label
from ruvllm.serving import MetricsSnapshot


def _ms(v: float) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v * 1000:.0f}"


def _f(v: float, digits: int = 1) -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def single_table(report: dict[str, Any]) -> Table:
    cfg = report["config"]
    table = Table(title=f"single stream: {report['backend']} | {report['model']} | prompt "
                        f"{cfg['prompt_length']} tok, gen {cfg['gen_length']} tok, {cfg['iterations']} runs")
    for col in ("metric", "mean", "p50", "p95", "p99"):
        table.add_column(col, justify="right" if col != "metric" else "left")
    rows = [("TTFT (ms)", "ttft_s", True), ("prefill (tok/s)", "prefill_tok_s", False),
            ("decode (tok/s)", "decode_tok_s", False), ("end-to-end latency (ms)", "e2e_s", True)]
    for label, key, ms in rows:
        s = report[key]
        fmt = _ms if ms else _f
        table.add_row(label, *(fmt(s[k]) for k in ("mean", "p50", "p95", "p99")))
    table.add_row("peak RSS (MB)", _f(report["peak_rss_mb"]), "", "", "")
    return table


def serving_table(results: Sequence[dict[str, Any]], title: str = "serving") -> Table:
    table = Table(title=title)
    cols = ("target", "clients", "rate", "done", "cut", "failed", "out tok/s", "req/s", "TTFT p50 ms",
            "TTFT p99 ms", "TPOT p50 ms", "ITL p50 ms", "ITL p99 ms", "e2e p50 s", "e2e p99 s")
    for col in cols:
        table.add_column(col, justify="left" if col == "target" else "right")
    for r in results:
        table.add_row(r["target"], str(r["concurrency"]), str(r["request_rate"]),
                      f"{r['completed']}/{r['num_requests']}", str(r["cut_short"]), str(r["failed"]),
                      _f(r["output_tok_s"]), _f(r["request_per_s"], 2), _ms(r["ttft_s"]["p50"]),
                      _ms(r["ttft_s"]["p99"]), _ms(r["tpot_s"]["p50"]), _ms(r["itl_s"]["p50"]),
                      _ms(r["itl_s"]["p99"]), _f(r["e2e_s"]["p50"], 2), _f(r["e2e_s"]["p99"], 2))
    return table


def print_tables(report: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    m = report["machine"]
    features = " ".join(m.get("cpu_features", {}).get("features", ())) or "features unknown"
    kind = f"{kind_label(m)}: " if m.get("cpu_features", {}).get("kind") else ""
    libraries = ", ".join(f"{k} {v}" for k, v in m["versions"].items())
    console.print(f"[dim]{kind}{m['cpu']} x{m['logical_cpus']} ({features}) | "
                  f"{m['platform']} | load {m['load_average_1m']} | {libraries}[/]")
    if report.get("single"):
        console.print(single_table(report["single"]))
    by_length: dict[int, list[dict[str, Any]]] = {}
    for r in report.get("serving") or ():
        by_length.setdefault(r.get("prompt_length") or 0, []).append(r)
    for length, rows in sorted(by_length.items()):  # one table per prompt length
        named = f", {length}-token prompts" if len(by_length) > 1 else ""
        console.print(serving_table(rows, title=f"serving: {report.get('model', '')}{named}"))
    spec = report.get("speculative")
    if spec and spec["draft_tokens"]:
        rate = spec["acceptance_rate"]
        console.print(f"speculative decoding (all levels): {spec['draft_tokens']} tokens drafted in "
                      f"{spec['drafts']} drafts, {spec['accepted_tokens']} accepted ({rate:.1%})")


def speculative_figures(snapshot: MetricsSnapshot) -> dict[str, Any]:
    """The engine's speculative-decoding counters (vLLM's ``spec_decode`` figures)."""
    return {"drafts": snapshot.spec_decode_drafts, "draft_tokens": snapshot.spec_decode_draft_tokens,
            "accepted_tokens": snapshot.spec_decode_accepted_tokens,
            "acceptance_rate": snapshot.spec_decode_acceptance_rate}


CSV_FIELDS = ("target", "concurrency", "request_rate", "num_requests", "completed", "failed", "cut_short",
              "max_tokens", "prompt_length", "duration_s", "output_tokens", "output_tok_s", "request_per_s")
CSV_STATS = ("ttft_s", "tpot_s", "itl_s", "e2e_s")


def to_csv(report: dict[str, Any]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    if report.get("serving"):
        quantiles = ("mean", "p50", "p95", "p99")
        w.writerow(list(CSV_FIELDS) + [f"{s}_{q}" for s in CSV_STATS for q in quantiles])
        for r in report["serving"]:
            w.writerow([r[f] for f in CSV_FIELDS] + [r[s][q] for s in CSV_STATS for q in quantiles])
    if report.get("single"):
        s = report["single"]
        w.writerow(["backend", "model", "run", "prompt_tokens", "output_tokens", "ttft_s", "prefill_tok_s",
                    "decode_tok_s", "e2e_s", "peak_rss_mb"])
        for i, run in enumerate(s["runs"]):
            w.writerow([s["backend"], s["model"], i, run["prompt_tokens"], run["output_tokens"],
                        run["ttft_s"], run["prefill_tok_s"], run["decode_tok_s"], run["e2e_s"],
                        s["peak_rss_mb"]])
    return buf.getvalue()


def to_json(report: dict[str, Any]) -> str:
    def clean(v: Any) -> Any:
        if isinstance(v, float) and (math.isnan(v) or math.isinf(v)):
            return None
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(report), indent=2)


def plot(results: Sequence[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Throughput, TTFT p50 and ITL p50 against concurrency, one line per target; one row of
    panels per prompt length when the results hold several."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def length(r: dict[str, Any]) -> int:
        return r.get("prompt_length") or 0

    targets = list(dict.fromkeys(r["target"] for r in results))  # one colour each, in every row
    lengths = sorted({length(r) for r in results})
    fig, grid = plt.subplots(len(lengths), 3, figsize=(15, 4.5 * len(lengths)), squeeze=False)
    panels = [("aggregate output tok/s", lambda r: r["output_tok_s"]),
              ("TTFT p50 (s)", lambda r: r["ttft_s"]["p50"]),
              ("inter-token latency p50 (ms)", lambda r: (r["itl_s"]["p50"] or math.nan) * 1000)]
    for axes, tokens in zip(grid, lengths, strict=True):
        for ax, (label, value) in zip(axes, panels, strict=True):
            for n, name in enumerate(targets):
                rows = sorted((r for r in results if r["target"] == name and length(r) == tokens),
                              key=lambda r: r["concurrency"])
                ys = [value(r) if value(r) is not None else math.nan for r in rows]
                ax.plot([r["concurrency"] for r in rows], ys, marker="o", label=name, color=f"C{n % 10}")
            ax.set_xscale("log", base=2)
            levels = sorted({r["concurrency"] for r in results})
            ax.set_xticks(levels, labels=[str(c) for c in levels])
            ax.minorticks_off()
            ax.set_xlabel("concurrent clients")
            ax.set_ylabel(label)
            ax.grid(True, alpha=0.3)
            if len(lengths) > 1:
                ax.set_title(f"{tokens}-token prompts", fontsize=9)
    # Below the panels, one target per line: labels name every option and would cover the data.
    legend = {label: handle for axes in grid for handle, label in zip(*axes[0].get_legend_handles_labels(),
                                                                      strict=True)}
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=1, fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, min(0.05 * len(targets) + 0.02, 0.5) / len(lengths), 1, 1))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
