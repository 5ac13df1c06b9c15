"""Run the conformance suite on one backend: what ``ruvllm conformance NAME`` calls.

The suite runs under pytest in this process (``--pyargs ruvllm.testing.suite``), isolated from
whatever pytest configuration the current directory has: a backend author's own ``addopts`` or
``python_files`` must not change which conformance tests run. A short summary (counts, each skip
with its reason, each failure) is printed after pytest's own report.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

import attrs
import pytest

SUITE_PACKAGE = "ruvllm.testing.suite"
#: Entry-point name of the plugin (``pytest11``); ``-p`` with it also works when plugin
#: autoloading is disabled (PYTEST_DISABLE_PLUGIN_AUTOLOAD), and is a no-op otherwise.
PLUGIN_NAME = "ruvllm_conformance"


@attrs.define
class Outcome:
    nodeid: str
    outcome: str
    reason: str = ""


@attrs.define(eq=False)  # pluggy keeps plugins in sets: identity hashing
class SummaryCollector:
    """pytest plugin object recording the outcome of every suite test."""

    outcomes: list[Outcome] = attrs.field(factory=list)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            outcome = report.outcome
        elif report.skipped:  # skipped in setup: unselected backend or missing capability
            outcome = "skipped"
        elif report.failed:  # a fixture failed, e.g. the backend could not load the model
            outcome = "error"
        else:
            return
        self.outcomes.append(Outcome(report.nodeid, outcome, _reason(report)))

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.outcomes:
            out[o.outcome] = out.get(o.outcome, 0) + 1
        return out


def _reason(report: pytest.TestReport) -> str:
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    if report.failed:
        crash = getattr(report.longrepr, "reprcrash", None)
        return crash.message.splitlines()[0] if crash is not None and crash.message else ""
    return ""


def pytest_args(backend: str, model: str | None, extra: Sequence[str] = ()) -> list[str]:
    """The pytest command line that runs the suite on ``backend``."""
    return [
        "--pyargs", SUITE_PACKAGE,
        "-p", PLUGIN_NAME,
        "-p", "no:cacheprovider",  # the suite lives in site-packages: write nothing there
        "-o", "addopts=",
        "-o", "python_files=test_*.py",
        "-o", "python_classes=Test*",
        "-o", "python_functions=test_*",
        "--ruvllm-backend", backend,
        "--ruvllm-model", model or "default",
        *extra,
    ]


def print_summary(collector: SummaryCollector, backend: str, model: str | None, exit_code: int,
                  out: TextIO) -> None:
    counts = collector.counts()
    listed = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no test ran"
    verdict = "PASS" if exit_code == 0 else f"FAIL (pytest exit code {exit_code})"
    print(f"\nruvllm conformance: backend {backend}, model {model or 'default'}: {listed} -> {verdict}",
          file=out)
    for o in collector.outcomes:
        if o.outcome in ("skipped", "failed", "error"):
            print(f"  {o.outcome.upper():8} {o.nodeid.split('::', 1)[-1]}: {o.reason}", file=out)


def run_conformance(backend: str, model: str | None = None, extra_pytest_args: Sequence[str] = (),
                    *, out: TextIO | None = None) -> int:
    """Run ``pytest --pyargs ruvllm.testing.suite --ruvllm-backend BACKEND`` and return its
    exit code (0: every test passed or was skipped with a reason)."""
    collector = SummaryCollector()
    code = pytest.main(pytest_args(backend, model, extra_pytest_args), plugins=[collector])
    exit_code = int(code)
    print_summary(collector, backend, model, exit_code, out or sys.stdout)
    return exit_code
