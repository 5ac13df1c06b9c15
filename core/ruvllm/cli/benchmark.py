"""``ruvllm benchmark [MODEL]``: single-stream latency and multi-client serving throughput.

``--mode single`` times lone requests on the backend; ``--mode serving`` sweeps concurrency
levels against the in-process ServingEngine, or with ``--url`` against any OpenAI-compatible
server so peers are measured the same way. Output: a table on the terminal, and JSON, CSV and a
PNG plot on request. The machine, backend, model and library versions go with every result.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ruvllm.cli.app import (
    backend_option,
    config_from,
    engine_overrides,
    main,
    options_option,
    speculative_option,
)
from ruvllm.errors import InvalidRequest


def concurrency_levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InvalidRequest("concurrency",
                             f"must be a comma-separated list of integers, got {text!r}") from None
    if not levels or any(c < 1 for c in levels):
        raise InvalidRequest("concurrency", f"levels must be >= 1, got {text!r}")
    return levels


def progress_bar(console: Console) -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=True)


def level_ticks(bar: Progress, label: str = "") -> Callable[[int, int, int], None]:
    """A serving sweep's progress callback: one bar per client count, ``label`` before it."""
    tasks: dict[int, Any] = {}

    def tick(c: int, done: int, total: int) -> None:
        if c not in tasks:
            tasks[c] = bar.add_task(f"{label}{c} clients", total=total)
        bar.update(tasks[c], completed=done)

    return tick


def _single(config, cfg, console: Console) -> dict[str, Any]:
    from ruvllm.bench.single import run_single_stream
    from ruvllm.llm import LLM

    with LLM(config=config) as llm, progress_bar(console) as bar:
        task = bar.add_task("single stream", total=cfg.warmup + cfg.iterations)

        def tick(phase: str, done: int, total: int) -> None:
            bar.update(task, completed=done, description=f"single stream ({phase})")

        return run_single_stream(llm, cfg, tick)


async def _serving(config, *, url: str | None, api_key: str | None, served_model: str | None,
                   label: str | None, levels: list[int],
                   num_requests: int | None, max_tokens: int, prompt_length: int, request_rate: float,
                   console: Console) -> tuple[list[dict[str, Any]], dict[str, str]]:
    from ruvllm.bench.prompts import fresh_prompt_ids, fresh_prompts
    from ruvllm.bench.report import speculative_figures
    from ruvllm.bench.serving import EachPromptOnce, EngineTarget, HttpTarget, sweep, sweep_requests

    def per_level(c: int) -> int:
        return num_requests or max(4, 2 * c)

    # Every request, the warm-up's too, a prompt of its own: a prompt sent again (at the next level)
    # would be served from the prefix cache and measure the cache, not serving.
    count = sweep_requests(levels, per_level)
    with progress_bar(console) as bar:
        tick = level_ticks(bar)
        if url is None:
            from ruvllm.server.runner import load_engine

            engine = load_engine(config)
            try:
                prompts = fresh_prompt_ids(engine.tokenizer, prompt_length, count)
                target = EachPromptOnce(EngineTarget(engine, prompts, name=label))
                results = await sweep(target, levels, num_requests=per_level, max_tokens=max_tokens,
                                      prompt_length=prompt_length, request_rate=request_rate, progress=tick)
                meta = {"backend": engine.backend_name, "model": engine.info.name, "engine_path": engine.path,
                        "speculative": speculative_figures(engine.metrics())}
            finally:
                await engine.shutdown()
            return results, meta
        from ruvllm.llm import LLM

        with LLM(config=config) as llm:  # the model's tokenizer, to build prompts of a known length
            prompts_text = fresh_prompts(llm.tokenizer, [prompt_length] * count)
            model_name = llm.model.name
        async with HttpTarget(url, prompts_text, model=served_model, api_key=api_key,
                              extra_body={"ignore_eos": True}, name=label or url) as target:
            results = await sweep(EachPromptOnce(target), levels, num_requests=per_level,
                                  max_tokens=max_tokens, prompt_length=prompt_length,
                                  request_rate=request_rate, progress=tick)
        return results, {"backend": "remote", "model": target.model or model_name, "url": url}


@main.command()
@click.argument("model", required=False)
@backend_option
@options_option
@click.option("--mode", type=click.Choice(["single", "serving", "both"]), default="single", show_default=True)
@click.option("--warmup", type=int, default=2, show_default=True, help="Unrecorded requests first (single).")
@click.option("--iterations", type=int, default=5, show_default=True, help="Recorded requests (single).")
@click.option("--prompt-length", type=int, default=128, show_default=True, help="Prompt tokens.")
@click.option("--gen-length", type=int, default=64, show_default=True, help="Generated tokens (EOS ignored).")
@click.option("--concurrency", default="1,4,16", show_default=True, help="Client counts to sweep (serving).")
@click.option("--num-requests", type=int, help="Requests per level (default: max(4, 2 x clients)).")
@click.option("--request-rate", type=float, default=math.inf,
              help="Poisson arrivals, requests/s (default: inf).")
@click.option("--url", help="Benchmark this OpenAI-compatible server instead of the in-process engine.")
@click.option("--api-key", envvar="RUVLLM_API_KEY", help="API key for --url.")
@click.option("--served-model", help="Model id for --url (default: the server's first model).")
@click.option("--label", help="Name of this target in tables and plots.")
@click.option("--engine-option", "-e", "engine_opts", multiple=True, metavar="KEY=VALUE",
              help="ServingEngine option for the in-process engine (repeatable).")
@speculative_option
@click.option("--format", "fmt", type=click.Choice(["table", "json", "csv"]), default="table",
              show_default=True, help="What to print on stdout.")
@click.option("--output-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also write benchmark.json, benchmark.csv and benchmark.png (serving) here.")
@click.option("--plot-with", multiple=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Earlier benchmark JSON files whose serving results join the plot (repeatable).")
@click.pass_context
def benchmark(ctx: click.Context, model: str | None, backend: str | None, options: tuple[str, ...], mode: str,
              warmup: int, iterations: int, prompt_length: int, gen_length: int, concurrency: str,
              num_requests: int | None, request_rate: float, url: str | None, api_key: str | None,
              served_model: str | None, label: str | None, engine_opts: tuple[str, ...],
              speculative_config: str | None, fmt: str,
              output_dir: Path | None, plot_with: tuple[Path, ...]) -> None:
    """Measure MODEL (default: the embedded model): latency, throughput, memory."""
    from ruvllm.bench import report as rep
    from ruvllm.bench.machine import machine_info
    from ruvllm.bench.serving import ServingConfig
    from ruvllm.bench.single import SingleStreamConfig

    config = config_from(ctx, backend=backend, model=model, options=options)
    console = Console(stderr=True)
    levels = concurrency_levels(concurrency)
    single_cfg = SingleStreamConfig(prompt_length=prompt_length, gen_length=gen_length, warmup=warmup,
                                    iterations=iterations)
    # Validate serving flags before any model is loaded.
    ServingConfig(concurrency=levels[0], num_requests=num_requests or 1, max_tokens=gen_length,
                  prompt_length=prompt_length, request_rate=request_rate)
    if url and mode != "serving":
        raise InvalidRequest("url", "--url measures a server: use it with --mode serving")
    result: dict[str, Any] = {"machine": machine_info()}
    if mode in ("single", "both"):
        result["single"] = _single(config, single_cfg, console)
        result.update(backend=result["single"]["backend"], model=result["single"]["model"])
    if mode in ("serving", "both"):
        serving, meta = asyncio.run(_serving(
            config.with_engine(engine_overrides(engine_opts, speculative_config)), url=url, api_key=api_key,
            served_model=served_model, label=label, levels=levels, num_requests=num_requests,
            max_tokens=gen_length, prompt_length=prompt_length, request_rate=request_rate, console=console))
        result["serving"] = serving
        result.update(meta)
    if fmt == "json":
        click.echo(rep.to_json(result))
    elif fmt == "csv":
        click.echo(rep.to_csv(result), nl=False)
    else:
        out = Console()
        rep.print_tables(result, out if out.is_terminal else Console(width=200))
    if output_dir is not None:
        output_dir.mkdir(parents=True, exist_ok=True)
        (output_dir / "benchmark.json").write_text(rep.to_json(result))
        (output_dir / "benchmark.csv").write_text(rep.to_csv(result))
        written = [output_dir / "benchmark.json", output_dir / "benchmark.csv"]
        if result.get("serving"):
            series = list(result["serving"])
            for path in plot_with:
                series += json.loads(path.read_text()).get("serving") or []
            m = result["machine"]
            title = f"{result.get('model', '')} | {m['cpu']} x{m['logical_cpus']}"
            try:
                written.append(rep.plot(series, output_dir / "benchmark.png", title=title))
            except ImportError:
                console.print("[yellow]no plot: matplotlib is not installed (pip install 'ruvllm[plot]')[/]")
        console.print("wrote " + ", ".join(str(p) for p in written))
