"""A test that kills its pytest-xdist worker with a signal is one failed test naming the signal,
and the rest of the run goes on (tests/crashed_workers.py, loaded by tests/conftest.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from child_pytest import SKIP_UNUSED_PLUGINS

TESTS_DIR = Path(__file__).resolve().parents[1]

#: One group as ``make test`` makes a test file: the crash sits between tests that must still run.
CRASHING = '''
import os, signal
import pytest

pytestmark = pytest.mark.xdist_group("one-file")

def test_before():
    pass

def test_dies_of_sigill():
    os.kill(os.getpid(), signal.SIGILL)

def test_after():
    pass
'''
OTHERS = '''
import pytest

@pytest.mark.parametrize("n", range(6))
def test_elsewhere(n):
    pass
'''


def run_inner(tmp_path: Path) -> subprocess.CompletedProcess:
    """Without the plugin, the same run ends in xdist's ``INTERNALERROR ... KeyError:
    <WorkerController gw3>`` after the replacement workers die on the crashed test again."""
    (tmp_path / "test_crashing.py").write_text(CRASHING)
    (tmp_path / "test_others.py").write_text(OTHERS)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS_DIR), os.environ.get("PYTHONPATH", "")]),
           "PYTEST_ADDOPTS": SKIP_UNUSED_PLUGINS}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
         "-p", "crashed_workers", "-rfs", str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)


def test_a_crash_is_one_failure_naming_the_signal(tmp_path):
    result = run_inner(tmp_path)
    out = result.stdout + result.stderr
    assert "INTERNALERROR" not in out, out
    assert result.returncode == 1, out
    summary = out.strip().splitlines()[-1]
    # The replacement worker runs the rest of the group and skips the crashed test, saying why.
    assert "1 failed" in summary and "8 passed" in summary and "1 skipped" in summary, out
    assert "FAILED test_crashing.py::test_dies_of_sigill" in out, out
    assert "crashed a worker earlier in this run" in out, out
    assert "Fatal Python error: Illegal instruction" in out, out
    # One failure report, however wide the terminal's summary line is.
    crashed = "FAILED test_crashing.py::test_dies_of_sigill"
    failed = [line for line in out.splitlines() if line.startswith(crashed)]
    assert len(failed) == 1, out
