"""``ruvllm run-batch -i INPUT -o OUTPUT``: a file of OpenAI batch requests answered offline.

vLLM's ``run-batch`` under the same flags: the requests of an OpenAI batch file (chat, completions,
embeddings, Responses, Anthropic messages) run through the same routes ``ruvllm serve`` answers,
without a socket, batched by the engine, and their answers land in OpenAI's batch output format.
"""

from __future__ import annotations

import asyncio
import time

import click
from rich.console import Console

from ruvllm.cli.app import backend_option, config_from, engine_overrides, main, model_option


@main.command(name="run-batch")
@click.option("--input-file", "-i", "input_file", required=True, metavar="PATH|URL|-",
              help="OpenAI batch file: one {custom_id, method, url, body} per line (a path, an http(s) URL "
                   "read with GET, or - for standard input).")
@click.option("--output-file", "-o", "output_file", required=True, metavar="PATH|URL|-",
              help="Where the answers go, one per input line in its order (a path, an http(s) URL written "
                   "with PUT, or - for standard output).")
@backend_option
@model_option
@click.option("--option", "options", multiple=True, metavar="KEY=VALUE",
              help="Backend option, e.g. --option n_threads=2 (repeatable; -o is the output file here, as "
                   "in vLLM's run-batch).")
@click.option("--served-model-name", help="The model name the lines' bodies use (default: the model's name).")
@click.option("--max-concurrent", type=int, help="Most requests running at once (engine max_num_seqs).")
@click.option("--max-context", type=int,
              help="Cap on prompt + max_tokens of one request (default: the model's).")
@click.option("--engine-option", "-e", "engine_opts", multiple=True, metavar="KEY=VALUE",
              help="ServingEngine option, e.g. -e max_batch_tokens=1024 (repeatable; see docs/engine.md).")
@click.option("--quiet", "-q", is_flag=True, help="No banner, progress bar or summary on stderr.")
@click.pass_context
def run_batch(ctx: click.Context, input_file: str, output_file: str, backend: str | None, model: str | None,
              options: tuple[str, ...], served_model_name: str | None, max_concurrent: int | None,
              max_context: int | None, engine_opts: tuple[str, ...], quiet: bool) -> None:
    """Answer a file of OpenAI batch requests (as vLLM's run-batch) and write OpenAI's batch output."""
    from ruvllm.cli.benchmark import progress_bar
    from ruvllm.engine import EngineOptions
    from ruvllm.server.batches.batch_file import check_output, parse_batch, read_text, run_lines, write_output
    from ruvllm.server.runner import build_app

    # The whole file is checked before a model loads: a malformed line costs no load time.
    lines = parse_batch(read_text(input_file))
    check_output(output_file)
    config = config_from(ctx, backend=backend, model=model, options=options)
    overrides = engine_overrides(engine_opts, None)
    if max_concurrent is not None:
        overrides["max_num_seqs"] = max_concurrent
    config = config.with_engine(overrides)
    engine_options = EngineOptions.from_mapping(config.engine)
    # Enough lines in flight to fill every running slot and as many queued behind them, never more
    # than the engine's queue holds, so no line meets a full queue.
    window = engine_options.max_num_seqs + min(engine_options.max_num_seqs, engine_options.max_queue)
    app, _, banner = build_app(config, served_name=served_model_name, max_context=max_context)
    console = Console(stderr=True, quiet=quiet)
    if not quiet:
        click.echo(banner, err=True)
    started = time.perf_counter()

    def produce(out):
        with progress_bar(console) as bar:
            task = bar.add_task("running batch", total=len(lines))
            return asyncio.run(run_lines(app, lines, out, window=window,
                                         progress=lambda done, _: bar.update(task, completed=done)))

    summary = write_output(output_file, produce)
    if not quiet:
        click.echo(f"ruvllm: {summary.total} requests in {time.perf_counter() - started:.1f} s: "
                   f"{summary.succeeded} answered, {summary.failed} refused or failed "
                   f"(each line's status_code and error are in {output_file})", err=True)
