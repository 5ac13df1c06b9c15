"""The crash guard (ruvllm.native_probe): a backend whose native code dies on this CPU is
unavailable with a reason naming the signal, the CPU kind and the fix; `auto` moves on; the
verdict is kept per build and machine. The backends here are fakes whose probe kills itself in
the child, as llama.cpp's AMX build does on an Intel Xeon (this host may be any kind)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from core_fakes import registry_of
from ruvllm import native_probe
from ruvllm.backend import LlmBackend
from ruvllm.cli import main
from ruvllm.errors import BackendUnavailable
from ruvllm.hardware import cpu_info
from ruvllm.native_probe import NativeProbe, crash_reason
from ruvllm.types import Capabilities

HERE = Path(__file__).resolve().parent
FIX = "rebuild the engine for this CPU"


def probe(function: str, build: str = "build-1") -> NativeProbe:
    return NativeProbe(target=f"probe_targets:{function}", build_id=build, fix=lambda signum: FIX)


def fake_backend(name: str, function: str | None) -> type[LlmBackend]:
    class Fake(LlmBackend):
        @classmethod
        def capabilities(cls):
            return Capabilities(device="cpu")

        @classmethod
        def native_probe(cls):
            return None if function is None else probe(function)

        @classmethod
        def load(cls, model, options):
            raise RuntimeError("not loaded by these tests")

        tokenizer = info = None

        def generate(self, prompt_ids, params):
            return iter(())

    Fake.name = name
    return Fake


@pytest.fixture(autouse=True)
def fresh(monkeypatch, tmp_path):
    """Probe targets importable in the child, verdicts kept under tmp_path, none in memory."""
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    native_probe._outcome.cache_clear()
    yield
    native_probe._outcome.cache_clear()


def test_a_native_crash_is_a_reason_naming_signal_kind_and_fix(tmp_path):
    reason = crash_reason("fake", probe("dies_of_sigill"))
    assert reason is not None
    assert "SIGILL (Illegal instruction)" in reason
    assert cpu_info().kind_summary() in reason and reason.endswith(FIX)


def test_an_abort_names_the_assert(tmp_path):
    reason = crash_reason("fake", probe("aborts"))
    assert "SIGABRT" in reason and "GGML_ASSERT(n_outputs_max <= cparams.n_outputs_max)" in reason


def test_the_verdict_is_kept_per_build_and_machine(tmp_path, monkeypatch):
    first = crash_reason("fake", probe("dies_of_sigill"))
    native_probe._outcome.cache_clear()  # a new process: only the file remains

    def no_child(*args, **kwargs):
        raise AssertionError("the child ran again for a build already judged")

    monkeypatch.setattr(subprocess, "run", no_child)
    assert crash_reason("fake", probe("dies_of_sigill")) == first
    kept = list((tmp_path / "ruvllm" / native_probe.PROBES_DIR).glob("fake-*.json"))
    assert len(kept) == 1 and json.loads(kept[0].read_text())["ok"] is False
    monkeypatch.undo()
    monkeypatch.setenv("PYTHONPATH", str(HERE))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    # A rebuilt library is judged again (here it runs).
    assert crash_reason("fake", NativeProbe(target="probe_targets:runs", build_id="build-2",
                                            fix=lambda s: FIX)) is None


def test_no_verdict_without_a_crash(tmp_path):
    """A probe that runs is cached as fine; one that cannot run here (no model) holds nothing
    back and is asked again next time."""
    assert crash_reason("ok", probe("runs")) is None
    assert crash_reason("nomodel", probe("has_no_model")) is None
    kept = {p.name.split("-")[0] for p in (tmp_path / "ruvllm" / native_probe.PROBES_DIR).glob("*.json")}
    assert kept == {"ok"}


def test_auto_skips_a_backend_that_dies_and_select_names_why():
    dying, fine = fake_backend("dying", "dies_of_sigill"), fake_backend("fine", None)
    registry = registry_of(dying, fine)
    choice = registry.auto_choice()
    assert choice.name == "fine"
    assert "dying: its native code died with SIGILL" in choice.why
    with pytest.raises(BackendUnavailable, match="SIGILL"):
        registry.select("dying")


def test_backends_lists_it_unavailable_with_the_reason(monkeypatch):
    from ruvllm.cli import backends

    registry = registry_of(fake_backend("dying", "dies_of_sigill"), fake_backend("fine", None))
    monkeypatch.setattr(backends, "get_registry", lambda: registry)
    out = CliRunner().invoke(main, ["backends", "--json"])
    assert out.exit_code == 0, out.output
    rows = {row["name"]: row for row in json.loads(out.output)["backends"]}
    assert rows["fine"]["available"] and not rows["dying"]["available"]
    assert "SIGILL" in rows["dying"]["reason"] and rows["dying"]["reason"].endswith(FIX)
    text = " ".join(CliRunner().invoke(main, ["backends"]).output.split())
    assert "unavailable" in text and "SIGILL" in text
    assert f"CPU kind: {cpu_info().kind_summary()}" in text
