"""``ruvllm.testing.run_conformance``, what ``ruvllm conformance NAME`` calls."""

from __future__ import annotations

import re
import sys

import pytest

MAIN = (
    "import sys\n"
    "from ruvllm.testing import run_conformance\n"
    "sys.exit(run_conformance(sys.argv[1], None, ['-p', 'register_toys', '-k', 'TestKvReset']))\n"
)


def test_run_conformance_returns_pytest_exit_code(toy_env: pytest.Pytester) -> None:
    """Exit code 1 and a FAIL summary naming the failed tests on the leaky toy; 0 and PASS on
    the correct one. Runs in a child process, as the CLI would."""
    toy_env.makepyfile(conformance_main=MAIN)
    leaky = toy_env.run(sys.executable, "conformance_main.py", "toy-leaky", timeout=600)
    summary = leaky.stdout.str()
    assert leaky.ret == 1, summary[-3000:]
    assert "ruvllm conformance: backend toy-leaky, model default:" in summary
    assert "-> FAIL (pytest exit code 1)" in summary
    assert "FAILED   TestKvReset::test_output_unchanged_after_long_prompt[toy-leaky]" in summary
    good = toy_env.run(sys.executable, "conformance_main.py", "toy", timeout=600)
    assert good.ret == 0, good.stdout.str()[-3000:]
    assert "-> PASS" in good.stdout.str()


def test_run_conformance_ignores_host_pytest_config(toy_env: pytest.Pytester) -> None:
    """A backend author's own pytest configuration (here addopts selecting nothing and an odd
    python_files) does not change which conformance tests run."""
    toy_env.makeini("[pytest]\naddopts = -k nothing_matches_this\npython_files = check_*.py\n")
    toy_env.makepyfile(conformance_main=MAIN)
    good = toy_env.run(sys.executable, "conformance_main.py", "toy", timeout=600)
    assert good.ret == 0, good.stdout.str()[-3000:]
    # Had the host's addopts or python_files applied, nothing would run (exit code 5).
    assert re.search(r"\b[1-9]\d* passed", good.stdout.str())


def test_cli_without_pytest_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Core installed without the test tools: a clear message, not ModuleNotFoundError."""
    import importlib.util

    from click.testing import CliRunner
    from ruvllm.cli import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "pytest" else real(name, *a))
    result = CliRunner().invoke(main, ["conformance", "llamacpp"])
    assert result.exit_code != 0
    assert "pip install 'ruvllm[conformance]'" in result.output
