"""``ruvllm backends``: every discovered plugin, whether it can run here, and why not."""

from __future__ import annotations

import json

import click
from rich.console import Console
from rich.table import Table

from ruvllm.cli.app import main
from ruvllm.config import load_config
from ruvllm.engine import EngineOptions
from ruvllm.errors import RuvllmError
from ruvllm.hardware import cpu_info
from ruvllm.plugins import AUTO_PREFERENCE, BackendRegistry, get_registry, platform_key, why_unavailable
from ruvllm.registry import resolve


def _auto_for_default_model(reg: BackendRegistry) -> str:
    """What ``ruvllm serve`` with no configuration would pick, and why: a tune record or a
    backend's claim can put another backend ahead of the fixed order for this model."""
    try:
        config = load_config()
        model = resolve(config.model, config.cache_dir)
        load = EngineOptions.from_mapping(config.engine).max_num_seqs
        return str(reg.auto_choice(model, load=load, cache_dir=config.cache_dir))
    except RuvllmError as exc:
        return f"auto cannot pick for the configured model: {exc}"


def _report() -> dict:
    reg = get_registry()
    rows = []
    for name in sorted(reg.backends):
        cls = reg.backends[name]
        reason = why_unavailable(cls)
        caps = cls.capabilities().as_dict() if reason is None else None
        rows.append({
            "name": name,
            "distribution": reg.providers.get(name, ""),
            "version": cls.version(),
            "available": reason is None,
            "reason": reason,
            "formats": list(cls.formats),
            "capabilities": caps,
        })
    failures = [{"plugin": f.plugin, "reason": f.reason} for f in reg.failures]
    return {"machine": cpu_info().as_dict(), "auto_order": list(AUTO_PREFERENCE[platform_key()]),
            "auto_for_serve": _auto_for_default_model(reg), "backends": rows, "failures": failures}


def _capability_text(caps: dict | None) -> str:
    if caps is None:
        return "-"
    flags = [k for k, v in caps.items() if v is True]
    return f"device={caps['device']}; " + ", ".join(flags)


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def backends(as_json: bool) -> None:
    """List installed backends, their capabilities, and plugins that failed to load."""
    report = _report()
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    console = Console()
    console.print(f"[bold]CPU[/]: {cpu_info().summary()}")
    console.print(f"[bold]CPU kind[/]: {cpu_info().kind_summary()} (docs/hardware.md says what runs where)")
    table = Table(title="ruvllm backends", show_lines=True)
    for col in ("backend", "version", "status", "formats", "capabilities"):
        table.add_column(col)
    for row in report["backends"]:
        status = "[green]available[/]" if row["available"] else f"[red]unavailable[/]: {row['reason']}"
        version = row["version"] or "?"
        table.add_row(row["name"], f"{version}\n({row['distribution']})", status,
                      ", ".join(row["formats"]), _capability_text(row["capabilities"]))
    console.print(table)
    for row in report["backends"]:
        for note in (row["capabilities"] or {}).get("notes", ()):
            console.print(f"[bold]{row['name']}[/]: {note}")
    console.print(f"auto preference here: {' > '.join(report['auto_order'])}")
    console.print(f"ruvllm serve with the configured model: {report['auto_for_serve']}")
    for f in report["failures"]:
        console.print(f"[red]plugin {f['plugin']} failed to load[/]: {f['reason']}")
    if not report["backends"]:
        console.print("no backends installed: pip install ruvllm-llamacpp (or another plugin)")
