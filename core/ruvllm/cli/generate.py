"""``ruvllm generate``: one prompt, streamed to the terminal."""

from __future__ import annotations

import sys

import click

from ruvllm.cli.app import backend_option, config_from, main, model_option, options_option
from ruvllm.llm import LLM


def sampling_options(f):
    """Sampling flags shared by every command that generates."""
    for opt in reversed([
        click.option("--max-tokens", "-n", type=int, default=256, show_default=True),
        click.option("--temperature", "-t", type=float, default=0.0, show_default=True,
                     help="0 is greedy."),
        click.option("--top-p", type=float, default=1.0, show_default=True),
        click.option("--top-k", type=int, default=0, show_default=True, help="0 disables."),
        click.option("--min-p", type=float, default=0.0, show_default=True),
        click.option("--repetition-penalty", type=float, default=1.0, show_default=True),
        click.option("--frequency-penalty", type=float, default=0.0, show_default=True),
        click.option("--presence-penalty", type=float, default=0.0, show_default=True),
        click.option("--stop", multiple=True, help="Stop string (repeatable)."),
        click.option("--seed", type=int, default=None),
    ]):
        f = opt(f)
    return f


@main.command()
@click.argument("prompt")
@backend_option
@model_option
@options_option
@sampling_options
@click.option("--chat/--raw", default=False,
              help="Wrap the prompt as a user message in the model's chat template.")
@click.option("--system", help="System message (with --chat).")
@click.option("--stats/--no-stats", default=True, help="Print tokens, timings and tok/s to stderr.")
@click.pass_context
def generate(ctx: click.Context, prompt: str, backend: str | None, model: str | None,
             options: tuple[str, ...], chat: bool, system: str | None, stats: bool,
             **sampling) -> None:
    """Generate a completion of PROMPT, streaming tokens as they come."""
    sampling["stop"] = tuple(sampling["stop"])
    config = config_from(ctx, backend=backend, model=model, options=options)
    with LLM(config=config) as llm:
        if chat:
            messages = ([{"role": "system", "content": system}] if system else [])
            ids = llm.chat_prompt([*messages, {"role": "user", "content": prompt}])
        else:
            ids = llm.encode(prompt)
        stream = llm.stream(ids, **sampling)
        for out in stream:
            sys.stdout.write(out.text)
            sys.stdout.flush()
        sys.stdout.write("\n")
        result = stream.result
        if stats and result is not None:
            t = result.timings
            click.echo(
                f"[{llm.backend_name} | {llm.model.name}] {result.usage.prompt_tokens} prompt + "
                f"{result.usage.completion_tokens} generated tokens, "
                f"finish={result.finish_reason.value}, TTFT {t.time_to_first_token * 1000:.0f} ms, "
                f"decode {result.decode_tokens_per_second:.1f} tok/s",
                err=True,
            )
