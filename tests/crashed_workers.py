"""A test that kills its pytest-xdist worker (SIGILL, SIGSEGV, an abort) is one failed test that
names the signal, and the rest of the suite still runs.

Without this, ``--dist loadgroup`` puts the crashed test's whole group back in the queue,
crashed test included: the replacement worker runs it again and dies too, until xdist's
worker-restart limit ends the run with an INTERNALERROR that hides every later test (on an
Intel AMX host, a llama.cpp build that died with SIGILL took the suite down after 800 of
~1,950 tests). Here the replacement worker skips the crashed test, saying why, and runs the
rest of its group. (Marking the test done in xdist's queue instead raced with the scheduler:
a worker's channel closed under it and the run hung.) The failure carries what the worker's
faulthandler wrote ("Fatal Python error: Illegal instruction" and the Python stack) instead of
xdist's bare "worker crashed".
"""

from __future__ import annotations

import faulthandler
import os
import shutil
import tempfile
from pathlib import Path

import pytest

_INPUT_KEY = "ruvllm_crash_dir"
#: The controller's list of crashed tests, one node id a line, in the crash directory.
_CRASHED = "crashed.txt"
#: Where each worker's faulthandler writes (the controller makes it; workers are told by
#: ``workerinput``).
_crash_dir: Path | None = None
_crash_file = None


def pytest_configure(config: pytest.Config) -> None:
    global _crash_dir
    if hasattr(config, "workerinput"):
        return
    if config.pluginmanager.hasplugin("xdist") and config.getoption("numprocesses", None):
        _crash_dir = Path(tempfile.mkdtemp(prefix="ruvllm-pytest-crashes-"))


def pytest_unconfigure(config: pytest.Config) -> None:
    if _crash_dir is not None and not hasattr(config, "workerinput"):
        shutil.rmtree(_crash_dir, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    if _crash_dir is not None:
        node.workerinput[_INPUT_KEY] = str(_crash_dir)


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """In a worker: send faulthandler's fatal-signal dump to a file the controller reads. After
    pytest's own faulthandler plugin (configure time), which points it at stderr, where xdist's
    controller cannot tell which test it belongs to."""
    global _crash_file
    directory = getattr(session.config, "workerinput", {}).get(_INPUT_KEY)
    if directory:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "worker")
        _crash_file = open(Path(directory) / f"{worker}.log", "w")  # noqa: SIM115 (open until the process ends)
        faulthandler.enable(file=_crash_file, all_threads=True)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem: str, report: pytest.TestReport) -> None:
    """Record the crashed test (the workers skip it from now on) and say what killed it."""
    if _crash_dir is None:
        return
    with open(_crash_dir / _CRASHED, "a") as crashed:
        crashed.write(crashitem + "\n")
    worker = getattr(getattr(getattr(report, "node", None), "gateway", None), "id", None)
    report.longrepr = f"{report.longrepr}\n{crash_summary(_crash_dir / f'{worker}.log')}"


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """In a worker: a test that already crashed a worker in this run is not run again."""
    directory = getattr(item.config, "workerinput", {}).get(_INPUT_KEY)
    if directory and item.nodeid in _crashed(Path(directory)):
        pytest.skip("this test crashed a worker earlier in this run (reported there as failed); "
                    "not run again")


def _crashed(directory: Path) -> set[str]:
    try:
        return set((directory / _CRASHED).read_text().splitlines())
    except OSError:
        return set()


def crash_summary(path: Path) -> str:
    """faulthandler's dump, or why there is none (the worker died of SIGKILL, which no handler
    sees: the kernel's OOM killer, a timeout's kill)."""
    try:
        text = path.read_text().strip()
    except OSError:
        text = ""
    if not text:
        return ("the worker left no fatal-signal dump (killed by SIGKILL? the OOM killer, or a kill "
                "from outside)")
    return text[:4000]
