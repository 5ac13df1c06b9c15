"""Shared set-up for the tests of the conformance suite itself."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from child_pytest import SKIP_UNUSED_PLUGINS
from conformance_helpers import SuiteRun, read_junit


def pytest_configure(config: pytest.Config) -> None:
    # pytester provides the fixture that runs the suite in a child pytest. ``pytest_plugins``
    # is only allowed in the top-level conftest, so it is enabled here; pytest replays the
    # historic addoption/configure hooks for a plugin registered this late.
    if not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")


HERE = Path(__file__).resolve().parent
#: A ``-p`` plugin that registers the toy backends in-process through
#: ``get_registry().register_backend`` (how a backend object is injected into the suite).
REGISTER_PLUGIN = "import toy_backend\ntoy_backend.register_toy_backends()\n"


#: Below the 900 s pytest-timeout of the tests that run a whole suite, so that pytester kills a
#: child that overruns (and names it) instead of the parent's timeout leaving it running.
CHILD_TIMEOUT = 840


@pytest.fixture
def toy_env(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """A pytester directory where child processes can import the toys and ``-p register_toys``."""
    pytester.makepyfile(register_toys=REGISTER_PLUGIN)
    paths = [str(HERE), str(pytester.path), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    # Every child (suite runs, run_conformance's pytest.main) starts without the plugins it never
    # uses. Pytester drops the PYTEST_ADDOPTS that tests/conftest.py sets, so it is set again here.
    monkeypatch.setenv("PYTEST_ADDOPTS", SKIP_UNUSED_PLUGINS)
    return pytester


@pytest.fixture
def suite_runner(toy_env: pytest.Pytester):
    """Run the conformance suite in a child pytest process.

    ``toys=True`` (default) also loads ``-p register_toys``, which registers the toy backends
    in-process; without it the child sees only the backends installed as plugins.
    """

    def run(*args: str, toys: bool = True) -> SuiteRun:
        report = toy_env.path / "report.xml"
        report.unlink(missing_ok=True)
        plugin = ("-p", "register_toys") if toys else ()
        result = toy_env.runpytest_subprocess(
            *plugin, "-p", "no:cacheprovider",
            "--pyargs", "ruvllm.testing.suite",
            "-rs", f"--junitxml={report}", *args, timeout=CHILD_TIMEOUT,
        )
        return SuiteRun(result, read_junit(report) if report.exists() else {})

    return run
