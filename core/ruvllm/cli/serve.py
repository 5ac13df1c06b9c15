"""``ruvllm serve [MODEL]``: the OpenAI-compatible server on the batching engine."""

from __future__ import annotations

import click

from ruvllm.cli.app import (
    backend_option,
    config_from,
    engine_overrides,
    main,
    options_option,
    speculative_option,
)
from ruvllm.reasoning import REASONING_FORMATS
from ruvllm.scaleout.cli import run_scale_out, scale_out_options, scale_out_requested


@main.command()
@click.argument("model", required=False)
@backend_option
@options_option
@click.option("--host", help="Interface to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network).")
@click.option("--port", "-p", type=int, help="Port (default 8000).")
@click.option("--api-key", envvar="RUVLLM_API_KEY",
              help="Require 'Authorization: Bearer KEY' (or $RUVLLM_API_KEY).")
@click.option("--served-model-name", help="Model id clients use (default: the model's name).")
@click.option("--max-concurrent", type=int, help="Most requests running at once (engine max_num_seqs).")
@click.option("--batch-invariant", is_flag=True, default=False,
              help="A greedy or seeded request gives the same tokens and logprobs whatever runs beside it "
                   "(engine batch_invariant; candle_like, llamacpp; docs/engine.md).")
@click.option("--max-context", type=int,
              help="Cap on prompt + max_tokens of one request (default: the model's).")
@click.option("--max-tokens-limit", type=int, help="Largest max_tokens a request may ask for (default 4096).")
@click.option("--max-body-bytes", type=int, help="Largest request body; bigger ones get 413 (default 1 MiB).")
@click.option("--reasoning-format", type=click.Choice(REASONING_FORMATS),
              help="A chat answer's <think>...</think> as reasoning_content apart from its content: auto "
                   "(default: where the model's chat template writes think tags), deepseek (always), none.")
@click.option("--engine-option", "-e", "engine_opts", multiple=True, metavar="KEY=VALUE",
              help="ServingEngine option, e.g. -e max_batch_tokens=1024 (repeatable; see docs/engine.md).")
@speculative_option
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@click.option("--model", "-m", "extra_models", multiple=True, metavar="[NAME=]MODEL",
              help="Serve several models: repeat it (each loads at start; requests pick one by name; "
                   "[[models]] in ruvllm.toml sets more, see docs/configuration.md).")
@click.option("--lora", "lora", multiple=True, metavar="NAME=PATH",
              help="LoRA adapter (PEFT directory) served as model NAME (repeatable; LoRA backends only).")
@click.option("--allow-runtime-lora", is_flag=True, default=None,
              help="Allow POST /v1/load_lora_adapter and /v1/unload_lora_adapter (set --api-key too).")
@click.option("--no-ui", is_flag=True, help="No chat page at / and /ui (the API alone).")
@click.pass_context
@scale_out_options
def serve(ctx: click.Context, model: str | None, backend: str | None, options: tuple[str, ...],
          host: str | None, port: int | None, api_key: str | None, served_model_name: str | None,
          max_concurrent: int | None, batch_invariant: bool, max_context: int | None,
          max_tokens_limit: int | None, max_body_bytes: int | None, reasoning_format: str | None,
          engine_opts: tuple[str, ...],
          speculative_config: str | None, log_level: str, extra_models: tuple[str, ...],
          lora: tuple[str, ...], allow_runtime_lora: bool | None, no_ui: bool) -> None:
    """Serve MODEL (default: the embedded model) over an OpenAI-compatible HTTP API."""
    from ruvllm.server.runner import serve as run_server
    from ruvllm.server.runner import with_cli_models, with_lora_flags, with_server_overrides

    config = config_from(ctx, backend=backend, model=model, options=options)
    config = with_server_overrides(config, host=host, port=port, api_key=api_key,
                                   max_tokens_limit=max_tokens_limit, max_body_bytes=max_body_bytes,
                                   reasoning_format=reasoning_format, ui=False if no_ui else None)
    config = with_cli_models(with_lora_flags(config, lora, allow_runtime_lora), model, extra_models)
    overrides = engine_overrides(engine_opts, speculative_config)
    if max_concurrent is not None:
        overrides["max_num_seqs"] = max_concurrent
    if batch_invariant:
        overrides["batch_invariant"] = True
    config = config.with_engine(overrides)
    if scale_out_requested(ctx):
        run_scale_out(ctx, config, served_name=served_model_name, max_context=max_context,
                      log_level=log_level)
        return
    run_server(config, served_name=served_model_name, log_level=log_level, max_context=max_context)
