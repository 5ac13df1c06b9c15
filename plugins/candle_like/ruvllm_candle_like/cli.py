"""``ruvllm convert SRC DST``: registered on core's click group through ruvllm_register_commands."""

from __future__ import annotations

from typing import Any

import click


def register_convert(cli: Any) -> None:
    @cli.command("convert")
    @click.argument("src", type=click.Path(exists=True, dir_okay=False))
    @click.argument("dst", type=click.Path(file_okay=False))
    @click.option("--dtype", type=click.Choice(["float32", "bfloat16", "float16"]), default="float32",
                  show_default=True, help="dtype of the saved safetensors weights")
    @click.option("--force", is_flag=True, help="write into a non-empty DST")
    def convert(src: str, dst: str, dtype: str, force: bool) -> None:
        """Convert a GGUF model file SRC into a Hugging Face directory DST (candle_like)."""
        from ruvllm.errors import RuvllmError

        from ruvllm_candle_like.convert import gguf_to_hf

        try:
            out = gguf_to_hf(src, dst, dtype=dtype, overwrite=force)
        except RuvllmError as exc:
            raise click.ClickException(str(exc)) from exc
        click.echo(f"wrote {out} (config.json, model.safetensors, tokenizer.json, tokenizer_config.json, "
                   "generation_config.json)")
