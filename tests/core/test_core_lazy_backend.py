"""Backends registered by import path (``LazyBackend``): discovery and selection import nothing
a process does not use, and the registry still hands out the real class.

The guard against the regression itself (``ruvllm serve --backend llamacpp`` holding torch) is
``test_discovery_imports_no_engine`` and tests/llamacpp/test_llamacpp_footprint.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import uuid

import pytest
from core_fakes import registry_of, stub_backend_source
from ruvllm.errors import BackendUnavailable
from ruvllm.lazy_backend import LazyBackend
from ruvllm.models import ModelSource

GGUF = ModelSource(name="m", path="/models/m.gguf", format="gguf")


@pytest.fixture
def backend_module(tmp_path, monkeypatch):
    """Write a backend module under a unique name; return a function making a LazyBackend to it."""
    modules = []

    def make(name: str = "lazy", *, source: str | None = None, **kwargs) -> tuple[LazyBackend, str]:
        module = f"ruvllm_testlazy_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source or stub_backend_source(
            name, formats=("gguf", "hf"), device="marker", register=False)))
        modules.append(module)
        return LazyBackend(name, f"{module}:Backend", formats=("gguf", "hf"), **kwargs), module

    monkeypatch.syspath_prepend(str(tmp_path))
    yield make
    for m in modules:
        sys.modules.pop(m, None)



def test_registering_and_skipping_it_imports_nothing(backend_module):
    lazy, module = backend_module("lazy", requires=("ruvllm_no_such_engine_xyz",),
                                  install_hint="pip install ruvllm-lazy")
    reg = registry_of(lazy)
    assert reg.backends["lazy"].formats == ("gguf", "hf")
    reason = reg.backends["lazy"].unavailable_reason()
    assert reason == "'ruvllm_no_such_engine_xyz' not installed; pip install ruvllm-lazy"
    with pytest.raises(BackendUnavailable, match="ruvllm_no_such_engine_xyz"):
        reg.select("lazy", GGUF)
    with pytest.raises(BackendUnavailable, match="lazy: 'ruvllm_no_such_engine_xyz' not installed"):
        reg.select("auto", GGUF)
    assert module not in sys.modules


def test_the_registry_hands_out_the_real_class(backend_module):
    lazy, module = backend_module("lazy", requires=("pluggy",))
    reg = registry_of(lazy)
    assert module not in sys.modules
    cls = reg.select("lazy", GGUF)
    real = sys.modules[module].Backend
    assert cls is real and reg.get("lazy") is real and reg.select("auto", GGUF) is real
    assert reg.backends["lazy"].capabilities().device == "marker"  # forwarded to the class


def test_a_module_that_fails_to_import_is_a_reason(backend_module):
    lazy, _ = backend_module("lazy", source="raise OSError('libengine.so: cannot open shared object')\n")
    reason = lazy.unavailable_reason()
    assert reason.startswith(f"importing {lazy.target} failed: OSError: libengine.so")


def test_a_class_that_does_not_match_its_registration_is_a_reason(backend_module):
    lazy, _ = backend_module("other")
    mismatched = LazyBackend("lazy", lazy.target, formats=("gguf", "hf"))
    assert "declares name 'other'" in mismatched.unavailable_reason()


def test_private_lookups_do_not_import(backend_module):
    import copy

    lazy, module = backend_module("lazy")
    assert copy.copy(lazy) == lazy
    with pytest.raises(AttributeError):
        lazy.__wrapped__  # noqa: B018
    assert module not in sys.modules


def test_discovery_imports_no_engine():
    """Every installed plugin, discovered as the CLI does: no engine library gets imported."""
    code = textwrap.dedent("""
        import sys
        import ruvllm.cli  # discovery, and the plugins' ruvllm_register_commands
        from ruvllm.plugins import get_registry
        print(sorted(get_registry().backends))
        print(sorted(m for m in ("torch", "mlx", "mistralrs", "llama_cpp") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         check=True)
    backends, engines = out.stdout.strip().splitlines()
    assert engines == "[]", f"discovering {backends} imported {engines}"


def test_a_claim_is_asked_without_importing_the_engine(backend_module, tmp_path):
    """``auto`` asks a lazy backend's ``fastest_here`` through its own light module, and moves a
    backend that claims the model to the front of the fixed order, saying why."""
    claims = f"ruvllm_testclaim_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{claims}.py").write_text(textwrap.dedent("""
        def fastest_here(model):
            return "measured fastest on this kind" if model.format == "gguf" else None
    """))
    lazy, module = backend_module("candle_like", requires=("pluggy",), fastest=f"{claims}:fastest_here")
    reg = registry_of(lazy)
    assert reg.backends["candle_like"].fastest_here(GGUF) == "measured fastest on this kind"
    assert module not in sys.modules
    HF = ModelSource(name="m", path="/models/m", format="hf")
    assert reg.backends["candle_like"].fastest_here(HF) is None
    sys.modules.pop(claims, None)


def test_a_missing_engine_makes_no_claim(backend_module):
    lazy, _ = backend_module("lazy", requires=("ruvllm_no_such_engine_xyz",),
                                  fastest="ruvllm_no_such_claim_module:fastest_here")
    assert lazy.fastest_here(GGUF) is None  # not even the claim's module is imported
