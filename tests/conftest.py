"""Fixtures shared across test packages."""

from __future__ import annotations

import os

import pytest
from cpu_tolerances import isolation_bounds
from ruvllm.hardware import cpu_info
from ruvllm.testing.isolation import BOUNDS_ENV

#: A test that kills its xdist worker is one failed test naming the signal (crashed_workers.py).
pytest_plugins = ["crashed_workers"]


@pytest.fixture
def cpu_isolation_bounds(monkeypatch: pytest.MonkeyPatch):
    """``apply(backend)`` sets the isolation rule's bounds for ``backend`` on this CPU (for this
    test and the child processes it starts); the defaults stand where nothing is measured."""
    def apply(backend: str) -> None:
        bounds = isolation_bounds(cpu_info()).get(backend)
        if bounds is not None:
            monkeypatch.setenv(BOUNDS_ENV, bounds)
    return apply


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """``make test`` runs ``-n 2 --dist loadgroup --no-loadscope-reorder``: a test file is one
    unit of work, so its module-scoped models and servers load once, except tests marked
    ``spread`` (each whole-suite conformance run, minutes long), which are units of their own so
    two can run at once."""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        unit = item.nodeid if item.get_closest_marker("spread") else item.nodeid.split("::", 1)[0]
        item.add_marker(pytest.mark.xdist_group(unit))
    # Longest first, so the two workers end together: the scheduler hands out units in collection
    # order (the Makefile turns off xdist's reordering by test count, which put these one-test
    # units, up to 3 minutes each, last of all), and the whole-suite runs are the longest; then
    # modules of minutes (``long_unit``: the multi-node cluster, which lengthened the run by its
    # whole 2 minutes when it came last, and the longest files at the end of collection order:
    # SONA's training and the schema fuzz, 23-60 s each, which could leave one worker running alone).
    items.sort(key=lambda item: (item.get_closest_marker("spread") is None,
                                 item.get_closest_marker("long_unit") is None))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids: list[str]) -> None:
    """Refuse to run ungrouped: a module's tests split over both workers load its models and
    servers twice (Ray's app took 36 s per start). pytest-xdist marks a group by a suffix of the
    test's node id, which pytest 9.2 no longer reads back (constraints.txt pins pytest)."""
    if node.config.getvalue("dist") == "loadgroup" and not all("@" in i for i in ids):
        raise pytest.UsageError(
            f"--dist loadgroup did not group the tests (pytest {pytest.__version__}): pytest-xdist's "
            "xdist_group suffix is missing from the node ids; install the versions constraints.txt pins")


def pytest_configure(config: pytest.Config) -> None:
    """Under ``pytest -n N`` each worker gets its own share of the CPUs.

    Every engine sizes its thread pool from the affinity mask (llama.cpp's ``n_threads``, torch's
    and MKL's OpenMP, mistral.rs's rayon), so two workers never run four spinning threads on two
    cores: measured, the same run took 17.5 min unpinned (31 min of CPU) against 13 min pinned
    (18 min of CPU). Child processes (conformance runs, servers) inherit the share. Set before
    any engine is imported: those pools size themselves once.
    """
    _skip_unused_plugins_in_children()
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or workers < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) >= workers:
        os.sched_setaffinity(0, cpus[int(worker.removeprefix("gw")) % workers::workers])


def _skip_unused_plugins_in_children() -> None:
    """Pytest runs that read this environment (an in-process ``pytest.main``, a subprocess that
    keeps it) skip langsmith's plugin too, as addopts in pyproject.toml does here: 3 s of every
    start-up. The conformance runs' children (pytester drops this variable) and the crash test's
    inner run set the longer list of tests/child_pytest.py themselves."""
    opts = os.environ.get("PYTEST_ADDOPTS", "")
    if "no:langsmith_plugin" not in opts:
        os.environ["PYTEST_ADDOPTS"] = f"{opts} -p no:langsmith_plugin".strip()


@pytest.fixture
def emulated_cpu(monkeypatch):
    """``emulated_cpu(info)`` makes candle_like and SONA see ``info`` (a ruvllm.hardware.CpuInfo)
    as this machine's CPU, with nothing warned about yet in this process: how one host tests the
    dtype rules of both machine kinds."""
    from ruvllm_candle_like import cpu_dtype

    monkeypatch.setattr(cpu_dtype, "_warned", set())

    def use(info) -> None:
        monkeypatch.setattr(cpu_dtype, "cpu_info", lambda: info)

    return use


#: tests/conformance/test_mutation_proof.py's outcomes by test id (``NN-mutant-killed-by-test``),
#: for the summary. Here, not in tests/conformance/conftest.py: under pytest-xdist the controller,
#: which writes the summary, loads only this conftest and receives every worker's reports.
_MUTATION_OUTCOMES: dict[str, str] = {}
_MUTATION_TEST = "test_suite_kills_mutant["


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if _MUTATION_TEST in report.nodeid and (report.when == "call" or report.outcome != "passed"):
        _MUTATION_OUTCOMES[report.nodeid.split(_MUTATION_TEST, 1)[1].rstrip("]")] = report.outcome


def pytest_terminal_summary(terminalreporter) -> None:
    """The mutation score, visible in the run's output: a passed proof test is a killed mutant."""
    if not _MUTATION_OUTCOMES:
        return
    terminalreporter.write_sep("=", "llamacpp mutation proof (tests/conformance/llamacpp_mutants.py)")
    for test_id, outcome in sorted(_MUTATION_OUTCOMES.items()):
        verdict = {"passed": "killed", "failed": "SURVIVED"}.get(outcome, outcome)
        terminalreporter.write_line(f"{verdict:>9}  {test_id}")
    killed = sum(o == "passed" for o in _MUTATION_OUTCOMES.values())
    terminalreporter.write_line(f"mutation score: {killed}/{len(_MUTATION_OUTCOMES)} mutants killed")
