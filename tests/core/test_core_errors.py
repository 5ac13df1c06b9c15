"""ruvllm.errors is the one error hierarchy: every error class core and the bundled plugins
define lives there, under RuvllmError, with an HTTP status and an OpenAI error type."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest
import ruvllm.errors as errors

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [ROOT / "core" / "ruvllm", *sorted((ROOT / "plugins").glob("*/ruvllm_*"))]
ERRORS_PY = ROOT / "core" / "ruvllm" / "errors.py"

CLASSES = [cls for _, cls in inspect.getmembers(errors, inspect.isclass) if cls.__module__ == errors.__name__]


def test_every_error_has_a_status_and_a_type():
    assert len(CLASSES) > 10
    for cls in CLASSES:
        assert issubclass(cls, errors.RuvllmError), cls
        assert isinstance(cls.http_status, int) and 400 <= cls.http_status < 600, cls
        assert isinstance(cls.error_type, str) and cls.error_type, cls


def _base_names(node: ast.ClassDef) -> set[str]:
    names = set()
    for base in node.bases:
        if isinstance(base, ast.Name):
            names.add(base.id)
        elif isinstance(base, ast.Attribute):
            names.add(base.attr)
    return names


def test_no_error_class_is_defined_outside_ruvllm_errors():
    """A new error elsewhere would be a second hierarchy (or a status the server cannot map)."""
    error_names = {"Exception", "BaseException", *(cls.__name__ for cls in CLASSES)}
    elsewhere = []
    for source in SOURCES:
        for path in sorted(source.rglob("*.py")):
            if path == ERRORS_PY:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef) and _base_names(node) & error_names:
                    elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not elsewhere, "define these in ruvllm.errors: " + ", ".join(elsewhere)


@pytest.mark.parametrize("name", ["EngineClosed", "EngineOptionError", "RequestTimedOut"])
def test_engine_errors_keep_their_public_path(name):
    import ruvllm.engine

    assert getattr(ruvllm.engine, name) is getattr(errors, name)


def test_option_errors_name_their_table():
    engine = errors.OptionError.for_table("engine", "policy", "must be one of fcfs", "x")
    assert type(engine) is errors.EngineOptionError and engine.field == "policy"
    assert str(engine) == "engine.policy: must be one of fcfs; set it in the [engine] table of ruvllm.toml"
    backend = errors.OptionError.for_table("backends.toy", "bits", "must be 4", 5)
    assert type(backend) is errors.BackendOptionError and backend.backend == "toy"
    plugin = errors.OptionError.for_table("sona", "rank", "must be >= 1", 0)
    assert type(plugin) is errors.OptionError and isinstance(plugin, errors.ConfigError)
    assert str(plugin).startswith("sona.rank: must be >= 1; set it in the [sona] table")
