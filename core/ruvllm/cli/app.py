"""The click group, global options and the one place errors become exit codes."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import click

from ruvllm.config import Config, load_config, parse_option
from ruvllm.errors import RuvllmError


class RuvllmGroup(click.Group):
    """Runs commands with ruvllm errors turned into one line on stderr and exit code 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RuvllmError as exc:
            if ctx.obj and ctx.obj.get("verbose"):
                raise
            click.secho(f"error: {exc}", fg="red", err=True)
            sys.exit(1)
        except KeyboardInterrupt:
            click.echo("", err=True)
            sys.exit(130)


@click.group(cls=RuvllmGroup)
@click.version_option(package_name="ruvllm")
@click.option("--config", "config_path", type=click.Path(dir_okay=False, path_type=Path),
              help="TOML config file (default: ./ruvllm.toml, or $RUVLLM_CONFIG).")
@click.option("--cache-dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where downloaded models live (default: $RUVLLM_CACHE_DIR or ~/.cache/ruvllm).")
@click.option("-v", "--verbose", is_flag=True, help="Log what ruvllm decides and show tracebacks.")
@click.pass_context
def main(ctx: click.Context, config_path: Path | None, cache_dir: Path | None, verbose: bool) -> None:
    """ruvllm: one LLM serving runtime, many engines."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    ctx.ensure_object(dict)
    ctx.obj.update(config_path=config_path, cache_dir=cache_dir, verbose=verbose)


def config_from(ctx: click.Context, *, backend: str | None = None, model: str | None = None,
                options: tuple[str, ...] = ()) -> Config:
    """The effective config: file < environment < global flags < this command's flags."""
    obj = ctx.find_root().obj or {}
    return load_config(
        obj.get("config_path"),
        overrides={"backend": backend, "model": model, "cache_dir": obj.get("cache_dir")},
        backend_options=dict(parse_option(o) for o in options),
    )


backend_option = click.option("--backend", "-b", help="Backend name, or auto (default from config).")
model_option = click.option("--model", "-m",
                            help="Model alias, owner/repo or local path (default: the embedded model).")
options_option = click.option("--option", "-o", "options", multiple=True, metavar="KEY=VALUE",
                              help="Backend option, e.g. -o n_threads=2 (repeatable).")
speculative_option = click.option(
    "--speculative-config", metavar="JSON",
    help='Speculative decoding, as vLLM\'s flag: e.g. \'{"method": "ngram", "num_speculative_tokens": 8, '
         '"prompt_lookup_max": 4}\' or \'{"method": "draft_model", "model": "PATH_OR_NAME"}\' (keys: method, '
         'model, draft_backend, num_speculative_tokens, prompt_lookup_min, prompt_lookup_max, '
         'disable_by_batch_size, adaptive; docs/engine.md).')


def engine_overrides(engine_opts: tuple[str, ...], speculative_config: str | None) -> dict[str, Any]:
    """``[engine]`` overrides from ``-e KEY=VALUE`` flags and ``--speculative-config``."""
    from ruvllm.engine.options import speculative_config_options

    overrides = dict(parse_option(o) for o in engine_opts)
    if speculative_config:
        overrides.update(speculative_config_options(speculative_config))
    return overrides
