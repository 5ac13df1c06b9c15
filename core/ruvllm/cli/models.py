"""``ruvllm download``, ``list`` and ``info``: what models exist, which are here, what they are.

Nothing here loads a model onto a backend: ``info`` reads the GGUF header (or ``config.json``)
directly, so it is instant even for a 70B file, and ``list``/``info`` never touch the network
(cache lookups use ``huggingface_hub``'s local-files-only mode).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from ruvllm.cli.app import config_from, main
from ruvllm.errors import ModelNotFound
from ruvllm.gguf_file import read_gguf_file
from ruvllm.hardware import cpu_info
from ruvllm.models import ModelSource
from ruvllm.registry import (
    ALIASES,
    EMBEDDED_NAME,
    EMBEDDED_REFS,
    cached_models,
    embedded_model_path,
    fetch,
    looks_like_repo,
    resolve,
)


def disk_usage(path: Path) -> int:
    """Bytes a model occupies (a directory's files resolved through hub-cache symlinks)."""
    if path.is_file():
        return path.stat().st_size
    return sum(p.resolve().stat().st_size for p in path.rglob("*") if p.is_file())


def human_size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if size < 1024 or unit == "TB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def human_count(n: int | None) -> str:
    if not n:
        return "-"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= div:
            return f"{n / div:.1f}{suffix}"
    return str(n)


def local_source(ref: str, cache_dir: Path) -> ModelSource | None:
    """The model on disk for ``ref``, or None if it is a hub model not downloaded yet."""
    try:
        return resolve(ref, cache_dir, download=False)
    except ModelNotFound:
        if ref in ALIASES or looks_like_repo(ref):
            return None
        raise


def gguf_facts(path: Path) -> dict[str, Any]:
    """Architecture, parameter count, context, quantization and template from a GGUF header."""
    f = read_gguf_file(path)  # a truncated or foreign file is a ModelError saying so
    arch = f.get("general.architecture") or "unknown"
    tokens = f.get("tokenizer.ggml.tokens")
    return {
        "format": "gguf",
        "name": f.get("general.name"),
        "architecture": arch,
        "parameters": f.parameters,
        "context_length": f.get(f"{arch}.context_length"),
        "layers": f.get(f"{arch}.block_count"),
        "hidden_size": f.get(f"{arch}.embedding_length"),
        "quantization": f.file_type,
        "vocab_size": len(tokens) if tokens is not None else None,
        "chat_template": f.get("tokenizer.chat_template") is not None,
    }


def hf_facts(path: Path) -> dict[str, Any]:
    """The same facts from a Hugging Face directory's config.json and tokenizer_config.json."""
    def load(name: str) -> dict[str, Any]:
        p = path / name
        return json.loads(p.read_text()) if p.is_file() else {}

    cfg, tok = load("config.json"), load("tokenizer_config.json")
    params = None
    for idx in sorted(path.glob("*.safetensors")):
        params = (params or 0) + _safetensors_params(idx)
    archs = cfg.get("architectures") or [cfg.get("model_type", "unknown")]
    return {
        "format": "hf",
        "name": path.name,
        "architecture": cfg.get("model_type", archs[0]),
        "parameters": params,
        "context_length": cfg.get("max_position_embeddings"),
        "layers": cfg.get("num_hidden_layers"),
        "hidden_size": cfg.get("hidden_size"),
        "quantization": (cfg.get("quantization_config") or {}).get("quant_method") or cfg.get("torch_dtype"),
        "vocab_size": cfg.get("vocab_size"),
        "chat_template": bool(tok.get("chat_template")) or (path / "chat_template.jinja").is_file(),
    }


def _safetensors_params(path: Path) -> int:
    """Parameter count from a safetensors header (8-byte length + JSON), without reading tensors."""
    with path.open("rb") as fh:
        n = int.from_bytes(fh.read(8), "little")
        header = json.loads(fh.read(n))
    total = 0
    for name, meta in header.items():
        if name != "__metadata__":
            count = 1
            for d in meta["shape"]:
                count *= d
            total += count
    return total


def model_facts(source: ModelSource) -> dict[str, Any]:
    facts = gguf_facts(source.path) if source.format == "gguf" else hf_facts(source.path)
    facts.update(path=str(source.path), disk_usage=disk_usage(source.path), origin=source.origin)
    return facts


def catalogue(cache_dir: Path) -> list[dict[str, Any]]:
    """The embedded model, every alias, and any other repository found in the cache."""
    rows = [{"name": EMBEDDED_REFS[0], "source": f"embedded ({EMBEDDED_NAME})",
             "description": "SmolLM2 135M Instruct, Q4_1 (ships with ruvllm)",
             "path": embedded_model_path()}]
    for name, alias in sorted(ALIASES.items()):
        source = local_source(name, cache_dir)
        rows.append({"name": name, "source": alias.repo + (f":{alias.filename}" if alias.filename else ""),
                     "description": alias.description, "path": source.path if source else None})
    aliased = {a.repo for a in ALIASES.values()}
    for repo, _size in cached_models(cache_dir):
        if repo not in aliased:
            path = Path(cache_dir).expanduser() / "hub" / ("models--" + repo.replace("/", "--"))
            rows.append({"name": repo, "source": repo, "description": "downloaded", "path": path})
    for row in rows:
        row["downloaded"] = row["path"] is not None
        row["size"] = disk_usage(Path(row["path"])) if row["path"] is not None else None
    return rows


@main.command("download")
@click.argument("model")
@click.option("--revision", help="Branch, tag or commit of the repository (default: main).")
@click.option("--force", is_flag=True, help="Download again even if cached.")
@click.pass_context
def download(ctx: click.Context, model: str, revision: str | None, force: bool) -> None:
    """Download MODEL (an alias, owner/repo or owner/repo:FILE.gguf) into the cache.

    Interrupted downloads resume where they stopped; a progress bar shows on a terminal.
    """
    config = config_from(ctx)
    if model in EMBEDDED_REFS:
        click.echo(f"{model} is the embedded model; nothing to download ({embedded_model_path()})")
        return
    if model in ALIASES:
        alias = ALIASES[model]
        repo, filename = alias.repo, alias.filename
    elif looks_like_repo(model):
        repo, _, filename = model.partition(":")
        repo, _, pinned = repo.partition("@")
        revision = revision or pinned or None
        filename = filename or None
    else:
        raise ModelNotFound(f"{model!r} is not an alias or an owner/repo reference; "
                            f"see `ruvllm list` for the aliases")
    path = fetch(repo, filename, config.cache_dir, revision=revision, force=force)
    click.echo(f"downloaded {model} -> {path} ({human_size(disk_usage(path))})")


@main.command("list")
@click.option("--downloaded", is_flag=True, help="Only models present on this machine.")
@click.option("--long", "-l", "long_", is_flag=True, help="Show paths and sizes on disk.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def list_models(ctx: click.Context, downloaded: bool, long_: bool, as_json: bool) -> None:
    """List the embedded model, the aliases and downloaded models."""
    config = config_from(ctx)
    rows = [r for r in catalogue(config.cache_dir) if r["downloaded"] or not downloaded]
    if as_json:
        click.echo(json.dumps([{**r, "path": str(r["path"]) if r["path"] else None} for r in rows], indent=2))
        return
    table = Table(title=f"ruvllm models (cache: {config.cache_dir})")
    for col in ("name", "source", "description", "downloaded") + (("size", "path") if long_ else ()):
        table.add_column(col)
    for r in rows:
        cells = [r["name"], r["source"], r["description"], "yes" if r["downloaded"] else "no"]
        if long_:
            cells += [human_size(r["size"]), str(r["path"] or "-")]
        table.add_row(*cells)
    Console(width=200 if long_ else None).print(table)


@main.command("info")
@click.argument("model")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def info(ctx: click.Context, model: str, as_json: bool) -> None:
    """Architecture, size, context, quantization and download status of MODEL."""
    config = config_from(ctx)
    source = local_source(model, config.cache_dir)
    facts: dict[str, Any] = {"model": model, "downloaded": source is not None}
    if model in ALIASES:
        facts.update(repo=ALIASES[model].repo, file=ALIASES[model].filename,
                     description=ALIASES[model].description)
    if source is not None:
        facts.update(model_facts(source))
    # What the model would run on here: the dtype `auto` picks follows from these features.
    facts["machine"] = cpu_info().summary()
    if as_json:
        click.echo(json.dumps(facts, indent=2, default=str))
        return
    table = Table(show_header=False, title=f"ruvllm info {model}")
    labels = [("description", "description"), ("repo", "repository"), ("file", "file"),
              ("downloaded", "downloaded"), ("format", "format"), ("architecture", "architecture"),
              ("parameters", "parameters"), ("context_length", "context length"), ("layers", "layers"),
              ("hidden_size", "hidden size"), ("vocab_size", "vocabulary"), ("quantization", "quantization"),
              ("chat_template", "chat template"), ("disk_usage", "disk usage"), ("path", "path"),
              ("machine", "this machine")]
    for key, label in labels:
        if key not in facts or facts[key] is None:
            continue
        value = facts[key]
        if key == "parameters":
            value = f"{human_count(value)} ({value:,})"
        elif key == "disk_usage":
            value = human_size(value)
        elif isinstance(value, bool):
            value = "yes" if value else "no"
        table.add_row(label, str(value))
    Console().print(table)
    if source is None:
        click.echo(f"not downloaded: run `ruvllm download {model}`")
