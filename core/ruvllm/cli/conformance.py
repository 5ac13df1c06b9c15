"""``ruvllm conformance NAME``: run the backend conformance suite on an installed backend."""

from __future__ import annotations

import sys

import click

from ruvllm.cli.app import main


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("backend")
@click.option("--model", "-m", help="Model to test with (default: the embedded model).")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def conformance(backend: str, model: str | None, pytest_args: tuple[str, ...]) -> None:
    """Check that BACKEND keeps the LlmBackend contract (extra args go to pytest)."""
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        raise click.ClickException(
            "the conformance suite runs under pytest, which is not installed here: "
            "pip install 'ruvllm[conformance]' (or pip install pytest)")
    from ruvllm.testing import run_conformance

    sys.exit(run_conformance(backend, model, list(pytest_args)))
