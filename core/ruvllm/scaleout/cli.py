"""``ruvllm serve --ray [--replicas N]``: the click options and what they run.

The options are added by one decorator that takes its own arguments out of the command's
keyword arguments, so ``ruvllm serve``'s signature stays as it is; importing this module does
not import Ray (``ruvllm serve`` without ``--ray`` never loads it).
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from typing import Any

import click

from ruvllm.config import Config

_KEY = "ruvllm.scaleout"


def scale_out_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Add ``--ray`` and ``--replicas`` to a click command (place it right above the function)."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        use_ray, replicas = kwargs.pop("use_ray"), kwargs.pop("replicas")
        if replicas is not None and not use_ray:
            raise click.UsageError("--replicas needs --ray (several replicas run on Ray Serve)")
        click.get_current_context().meta[_KEY] = (use_ray, replicas)
        return f(*args, **kwargs)

    functools.update_wrapper(wrapper, f)
    wrapper.__click_params__ = list(getattr(f, "__click_params__", []))  # type: ignore[attr-defined]
    wrapper = click.option("--replicas", type=click.IntRange(min=1),
                           help="With --ray: engine replicas, each a ServingEngine on 1 CPU (default 1; "
                                "see docs/scale-out.md).")(wrapper)
    return click.option("--ray", "use_ray", is_flag=True,
                        help="Serve on Ray Serve: start a local Ray instance, or join $RAY_ADDRESS "
                             "(needs `pip install 'ruvllm[ray]'`).")(wrapper)


def scale_out_requested(ctx: click.Context) -> bool:
    return bool(ctx.meta.get(_KEY, (False, None))[0])


def run_scale_out(ctx: click.Context, config: Config, *, served_name: str | None,
                  max_context: int | None, log_level: str) -> None:
    """Serve ``config``'s model on Ray Serve until interrupted."""
    if importlib.util.find_spec("ray") is None or importlib.util.find_spec("ray.serve") is None:
        raise click.UsageError("--ray needs Ray Serve, which is not installed: pip install 'ruvllm[ray]'")
    several = len(getattr(config, "models", ()) or ()) > 1
    if several or config.server.lora_adapters:
        raise click.UsageError("--ray serves one model per Ray application, without LoRA adapters, for "
                               "now; drop the extra --model/[[models]] and --lora, or serve them without "
                               "--ray")
    if config.server.allow_runtime_lora:
        raise click.UsageError("--allow-runtime-lora does not work with --ray: a Serve handle reaches one "
                               "replica per call, so an adapter loaded through it would exist on one "
                               "replica only; serve without --ray to load adapters at runtime")
    from ruvllm.scaleout.app import ScaleOutSettings, serve_on_ray

    _, replicas = ctx.meta[_KEY]
    serve_on_ray(config, ScaleOutSettings(replicas=replicas or 1), served_name=served_name,
                 max_context=max_context, log_level=log_level)
