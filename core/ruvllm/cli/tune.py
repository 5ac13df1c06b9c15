"""``ruvllm tune [MODEL]``: measure every installed backend here, so ``auto`` picks by speed.

Each backend that can run here and read the model serves the same streaming load through the
in-process ServingEngine (the path ``ruvllm serve`` runs) at a few client counts; the figures
are recorded for this machine and model (ruvllm.auto_backend), and from then on
``backend = "auto"`` ranks backends by them for the load it is built for.
"""

from __future__ import annotations

import asyncio
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ruvllm.cli.app import config_from, main
from ruvllm.cli.benchmark import concurrency_levels, level_ticks, progress_bar
from ruvllm.errors import InvalidRequest, RuvllmError


def _candidates(source, wanted: str | None) -> tuple[list[str], list[str]]:
    """Backends to measure on model ``source``, and why the others are not measured."""
    from ruvllm.plugins import get_registry

    registry = get_registry()
    names = sorted(registry.backends) if wanted is None else [w.strip() for w in wanted.split(",")
                                                                if w.strip()]
    chosen, skipped = [], []
    for name in names:
        try:
            registry.select(name, source)
        except RuvllmError as exc:
            if wanted is not None:
                raise
            skipped.append(f"{name}: {exc}")
            continue
        chosen.append(name)
    if not chosen:
        raise InvalidRequest("backends",
                             "no installed backend can run this model here: " + "; ".join(skipped))
    return chosen, skipped


async def _measure(config, backend: str, levels: list[int], *, gen_length: int, prompt_length: int,
                   console: Console) -> list[dict[str, Any]]:
    from ruvllm.bench.prompts import fresh_prompt_ids
    from ruvllm.bench.serving import EachPromptOnce, EngineTarget, sweep, sweep_requests
    from ruvllm.server.runner import load_engine

    def per_level(c: int) -> int:
        return max(4, 2 * c)

    engine = load_engine(config)
    try:
        # Each request a prompt of its own: one sent again would be answered from the prefix cache,
        # which differs between backends and would rank them by their caches.
        count = sweep_requests(levels, per_level)
        prompts = fresh_prompt_ids(engine.tokenizer, prompt_length, count)
        with progress_bar(console) as bar:
            return await sweep(EachPromptOnce(EngineTarget(engine, prompts, name=backend)), levels,
                               num_requests=per_level, max_tokens=gen_length, prompt_length=prompt_length,
                               progress=level_ticks(bar, f"{backend}: "))
    finally:
        await engine.shutdown()


@main.command()
@click.argument("model", required=False)
@click.option("--backends",
              help="Comma-separated backends to measure (default: every one that can run here).")
@click.option("--concurrency", help="Client counts to measure (default: 1 and the engine's max_num_seqs).")
@click.option("--prompt-length", type=int, default=64, show_default=True, help="Prompt tokens.")
@click.option("--gen-length", type=int, default=32, show_default=True, help="Generated tokens (EOS ignored).")
@click.pass_context
def tune(ctx: click.Context, model: str | None, backends: str | None, concurrency: str | None,
         prompt_length: int, gen_length: int) -> None:
    """Measure the installed backends on MODEL (default: the embedded model) so that `auto`
    picks the fastest here for each load."""
    from ruvllm.auto_backend import Measurement, record_path, save_record
    from ruvllm.bench.machine import machine_line
    from ruvllm.engine.options import EngineOptions
    from ruvllm.registry import resolve

    config = config_from(ctx, model=model)
    max_num_seqs = EngineOptions.from_mapping(config.engine or {}).max_num_seqs
    levels = concurrency_levels(concurrency or f"1,{max_num_seqs}")
    if prompt_length < 1 or gen_length < 1:
        raise InvalidRequest("prompt_length/gen_length", "must be >= 1")
    console = Console(stderr=True)
    # Figures taken while other work runs mislead auto for as long as they are kept: say so.
    console.print(machine_line())
    source = resolve(config.model, config.cache_dir)
    names, skipped = _candidates(source, backends)
    for line in skipped:
        console.print(f"[yellow]not measured[/] {line}")
    measurements: list[Measurement] = []
    for name in names:
        console.print(f"measuring {name} at {', '.join(map(str, levels))} client(s)...")
        try:
            results = asyncio.run(_measure(config_from(ctx, model=model, backend=name), name, levels,
                                           gen_length=gen_length, prompt_length=prompt_length,
                                           console=console))
        except RuvllmError as exc:  # one backend failing here must not lose the others' figures
            console.print(f"[red]{name} failed[/]: {exc}")
            continue
        measurements += [Measurement(name, r["concurrency"], round(r["output_tok_s"], 2)) for r in results]
    if not measurements:
        raise InvalidRequest("backends", "no backend could be measured: nothing recorded")
    record = save_record(config.cache_dir, source, measurements)
    table = Table(title=f"output tokens/s, {prompt_length}-token prompts, {gen_length} new tokens")
    table.add_column("backend")
    for c in levels:
        table.add_column(f"{c} client(s)", justify="right")
    for name in dict.fromkeys(m.backend for m in measurements):
        figures = {m.clients: m.output_tok_s for m in measurements if m.backend == name}
        table.add_row(name, *(f"{figures[c]:.1f}" if c in figures else "-" for c in levels))
    out = Console()
    out.print(table)
    for load, what in ((1, "ruvllm generate / chat and LLM()"),
                       (max_num_seqs, f"ruvllm serve (max_num_seqs {max_num_seqs})")):
        out.print(f"auto now picks [bold]{record.ranking(load)[0][0]}[/] for {what}")
    out.print(f"recorded in {record_path(config.cache_dir, source)}")
