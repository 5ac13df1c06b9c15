"""Running the conformance suite in a child pytest and reading what happened to each test."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

import attrs
import pytest


@attrs.frozen
class Outcome:
    outcome: str  # passed, failed, error, skipped
    message: str = ""


@attrs.frozen
class SuiteRun:
    result: pytest.RunResult
    #: ``{"Class::test[params]": Outcome}`` for every test the child run reported.
    outcomes: dict[str, Outcome]

    def outcome(self, key: str) -> str | None:
        found = self.outcomes.get(key)
        return None if found is None else found.outcome

    def tail(self, chars: int = 4000) -> str:
        """End of the child's output, for assertion messages."""
        return self.result.stdout.str()[-chars:]


def read_junit(path: Path) -> dict[str, Outcome]:
    """Outcomes from pytest's JUnit XML, keyed without the module path (which depends on where
    ruvllm is installed)."""
    out: dict[str, Outcome] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        key = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        outcome = Outcome("passed")
        for tag in ("failure", "error", "skipped"):
            child = case.find(tag)
            if child is not None:
                name = {"failure": "failed"}.get(tag, tag)
                outcome = Outcome(name, child.get("message", ""))
                break
        out[key] = outcome
    return out


def skip_unless_installed(module: str, what: str) -> None:
    """Skip when ``module`` is missing, without importing it here.

    The child run is what loads the engine. Importing it in this process would be undone by
    pytester's ``sys.modules`` snapshot at teardown, and re-importing a C extension such as
    torch's after that crashes the interpreter.
    """
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{what} is not installed")
