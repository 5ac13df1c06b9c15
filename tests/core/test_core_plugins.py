"""Plugin discovery through real entry points, failure records, the allowlist and selection.

Each discovery test writes real installed distributions (``*.dist-info`` with
``entry_points.txt``, plus the plugin module) into a temporary directory put on ``sys.path``, so
``importlib.metadata`` finds them exactly as it finds a pip-installed plugin. The allowlist keeps
the project's real plugins out of these runs.
"""

from __future__ import annotations

import logging
import sys
import textwrap
import uuid
from pathlib import Path

import pytest
from core_fakes import registry_of, stub_backend_source
from ruvllm.backend import LlmBackend
from ruvllm.errors import BackendUnavailable, UnknownBackend
from ruvllm.models import ModelSource
from ruvllm.plugins import ALLOWLIST_ENV, AUTO_PREFERENCE, load_registry, platform_key
from ruvllm.types import Capabilities


class Site:
    """A directory of installed distributions on ``sys.path`` for one test."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch):
        self.root = root
        self.tag = uuid.uuid4().hex[:8]  # module names unique per test: sys.modules caches them
        self.modules: list[str] = []
        monkeypatch.syspath_prepend(str(root))
        self._monkeypatch = monkeypatch

    def module_name(self, short: str) -> str:
        return f"ruvllm_testplugin_{short}_{self.tag}"

    def add(self, dist: str, entry: str, source: str) -> str:
        """Install distribution ``dist`` whose ``ruvllm`` entry point ``entry`` is a module
        with ``source``; returns the module name."""
        module = self.module_name(entry)
        (self.root / f"{module}.py").write_text(textwrap.dedent(source))
        info = self.root / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "entry_points.txt").write_text(f"[ruvllm]\n{entry} = {module}\n")
        self.modules.append(module)
        return module

    def add_backend(self, dist: str, entry: str, backend: str, *, reason: str | None = None,
                    formats: tuple[str, ...] = ("gguf",)) -> str:
        return self.add(dist, entry, stub_backend_source(backend, reason=reason, formats=formats))

    def allow(self, *entries: str) -> None:
        self._monkeypatch.setenv(ALLOWLIST_ENV, ",".join(entries))

    def cleanup(self) -> None:
        for m in self.modules:
            sys.modules.pop(m, None)


@pytest.fixture
def site(tmp_path, monkeypatch):
    root = tmp_path / "site-packages"
    root.mkdir()
    s = Site(root, monkeypatch)
    yield s
    s.cleanup()


# -- discovery ----------------------------------------------------------------------------------
def test_a_good_plugin_registers_its_backend(site):
    site.add_backend("ruvllm-fake-good", "fake_good", "fake_good")
    site.allow("fake_good")
    reg = load_registry()
    assert list(reg.backends) == ["fake_good"]
    assert reg.providers["fake_good"] == "ruvllm-fake-good"
    assert reg.failures == []
    assert issubclass(reg.get("fake_good"), LlmBackend)
    assert reg.pm.get_plugin("fake_good") is not None


def test_a_plugin_whose_import_raises_is_recorded_and_hides_nothing(site):
    broken = "raise RuntimeError('libfoo.so: cannot open shared object')\n"
    site.add("ruvllm-fake-broken", "fake_broken", broken)
    site.add_backend("ruvllm-fake-good", "fake_good", "fake_good")
    site.add("ruvllm-fake-missing", "fake_missing", "import ruvllm_no_such_dependency_xyz\n")
    site.allow("fake_broken", "fake_good", "fake_missing")
    reg = load_registry()
    assert list(reg.backends) == ["fake_good"]
    by_plugin = {f.plugin: f for f in reg.failures}
    assert set(by_plugin) == {"ruvllm-fake-broken", "ruvllm-fake-missing"}
    assert by_plugin["ruvllm-fake-broken"].reason == "RuntimeError: libfoo.so: cannot open shared object"
    assert "Traceback" in by_plugin["ruvllm-fake-broken"].detail
    assert by_plugin["ruvllm-fake-missing"].reason.startswith("ModuleNotFoundError")
    assert "ruvllm_no_such_dependency_xyz" in by_plugin["ruvllm-fake-missing"].reason


def test_a_plugin_whose_hook_raises_is_recorded(site):
    site.add("ruvllm-fake-hook", "fake_hook", """
        from ruvllm import hookimpl

        @hookimpl
        def ruvllm_register_backends(register):
            raise ValueError("bad registration")
    """)
    site.add_backend("ruvllm-fake-good", "fake_good", "fake_good")
    site.allow("fake_hook", "fake_good")
    reg = load_registry()
    assert list(reg.backends) == ["fake_good"]
    assert [f.plugin for f in reg.failures] == ["ruvllm-fake-hook"]
    assert "registering backends failed: bad registration" in reg.failures[0].reason


def test_allowlist_loads_only_the_named_plugins(site):
    module_a = site.add_backend("ruvllm-fake-a", "fake_a", "fake_a")
    module_b = site.add("ruvllm-fake-b", "fake_b", "raise RuntimeError('must not be imported')\n")
    site.allow("fake_a")
    reg = load_registry()
    assert list(reg.backends) == ["fake_a"]
    assert reg.failures == []
    assert module_a in sys.modules and module_b not in sys.modules


def test_without_an_allowlist_every_installed_plugin_is_tried(site, monkeypatch):
    site.add_backend("ruvllm-fake-a", "fake_a", "fake_a")
    monkeypatch.delenv(ALLOWLIST_ENV, raising=False)
    reg = load_registry()
    assert "fake_a" in reg.backends
    for name, provider in reg.providers.items():  # the project's own plugins come along
        assert provider, name


def test_duplicate_backend_names_keep_the_first_and_record_the_second(site):
    site.add_backend("ruvllm-fake-one", "fake_one", "dup")
    site.add_backend("ruvllm-fake-two", "fake_two", "dup")
    site.allow("fake_one", "fake_two")
    reg = load_registry()
    assert list(reg.backends) == ["dup"]
    winner = reg.providers["dup"]
    loser = ({"ruvllm-fake-one", "ruvllm-fake-two"} - {winner}).pop()
    assert [(f.plugin, f.reason) for f in reg.failures] == [(loser, "backend name 'dup' is already taken")]


# -- selection ----------------------------------------------------------------------------------
def backend_class(name: str, *, reason: str | None = None, formats=("gguf",),
                  claim: str | None = None) -> type[LlmBackend]:
    class Fake(LlmBackend):
        @classmethod
        def unavailable_reason(cls):
            return reason

        @classmethod
        def fastest_here(cls, model):
            return claim

        @classmethod
        def capabilities(cls):
            return Capabilities()

        @classmethod
        def load(cls, model, options):
            raise AssertionError("selection must not load")

        tokenizer = info = None  # type: ignore[assignment]

        def generate(self, prompt_ids, params):
            return iter(())

    Fake.name = name
    Fake.formats = tuple(formats)
    return Fake



GGUF = ModelSource(name="m", path="/models/m.gguf", format="gguf")
HF = ModelSource(name="m", path="/models/m", format="hf")


def test_auto_follows_the_preference_order_not_registration_order():
    assert platform_key() == "default"  # this machine is Linux x86-64
    reg = registry_of(backend_class("zeta"), backend_class("mistralrs"), backend_class("candle_like"),
                      backend_class("llamacpp"))
    assert reg.select("auto").name == "llamacpp"
    del reg.backends["llamacpp"]
    assert reg.select("auto").name == "candle_like"
    del reg.backends["candle_like"]
    assert reg.select("auto").name == "mistralrs"
    del reg.backends["mistralrs"]
    assert reg.select("auto").name == "zeta"  # unknown names come after the known order


def test_a_backend_that_claims_the_model_goes_first_and_says_why(caplog):
    """Without a ``ruvllm tune`` record, the first backend of the fixed order that claims to serve
    the model fastest here (LlmBackend.fastest_here) is picked; the log line gives its reason."""
    reg = registry_of(backend_class("llamacpp"), backend_class("candle_like", claim="measured 2x here"),
                      backend_class("mistralrs", claim="also fast"))
    with caplog.at_level(logging.INFO, logger="ruvllm.plugins"):
        choice = reg.auto_choice(GGUF)
    assert choice.name == "candle_like"
    assert "candle_like claims this machine and model: measured 2x here" in caplog.text
    # Without a model there is nothing to claim; an unavailable claimer is passed over.
    assert reg.select("auto").name == "llamacpp"
    reg = registry_of(backend_class("llamacpp"), backend_class("candle_like", reason="no torch",
                                                               claim="measured 2x here"))
    assert reg.select("auto", GGUF).name == "llamacpp"


def test_auto_skips_unavailable_backends_and_logs_why(caplog):
    reg = registry_of(backend_class("llamacpp", reason="llama_cpp is not installed"),
                      backend_class("candle_like"))
    with caplog.at_level(logging.INFO, logger="ruvllm.plugins"):
        assert reg.select("auto", GGUF).name == "candle_like"
    assert "backend auto -> candle_like" in caplog.text
    assert "llamacpp: llama_cpp is not installed" in caplog.text


def test_auto_skips_backends_that_cannot_read_the_model_format():
    reg = registry_of(backend_class("llamacpp"), backend_class("candle_like", formats=("gguf", "hf")))
    assert reg.select("auto", GGUF).name == "llamacpp"
    assert reg.select("auto", HF).name == "candle_like"


def test_auto_with_nothing_usable_lists_every_reason():
    reg = registry_of(
        backend_class("llamacpp", reason="no llama_cpp"), backend_class("mlx", reason="not macOS")
    )
    with pytest.raises(BackendUnavailable) as info:
        reg.select("auto", GGUF)
    msg = str(info.value)
    assert "llamacpp: no llama_cpp" in msg and "mlx: not macOS" in msg
    assert "candle_like: not installed" in msg and "mistralrs: not installed" in msg


def test_apple_silicon_prefers_mlx(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr("platform.machine", lambda: "arm64")
    assert platform_key() == "darwin-arm64"
    reg = registry_of(backend_class("llamacpp"), backend_class("mlx"))
    assert reg.select("auto").name == "mlx"
    assert AUTO_PREFERENCE["darwin-arm64"][0] == "mlx"


def test_unknown_backend_lists_the_installed_names():
    reg = registry_of(backend_class("mlx"), backend_class("llamacpp"))
    with pytest.raises(UnknownBackend) as info:
        reg.select("vllm")
    assert info.value.known == ["llamacpp", "mlx"]
    assert "installed backends: llamacpp, mlx" in str(info.value)
    assert "pip install ruvllm-vllm" in str(info.value)


def test_unknown_backend_with_nothing_installed():
    with pytest.raises(UnknownBackend, match="installed backends: none"):
        registry_of().get("llamacpp")


def test_explicit_unavailable_backend_says_why():
    reg = registry_of(backend_class("mlx", reason="MLX needs macOS on Apple Silicon"))
    with pytest.raises(BackendUnavailable, match="MLX needs macOS on Apple Silicon") as info:
        reg.select("mlx")
    assert info.value.name == "mlx" and info.value.http_status == 503


def test_explicit_backend_that_cannot_read_the_format():
    reg = registry_of(backend_class("llamacpp"))
    assert reg.select("llamacpp", GGUF).name == "llamacpp"
    with pytest.raises(BackendUnavailable, match="cannot read hf models"):
        reg.select("llamacpp", HF)
