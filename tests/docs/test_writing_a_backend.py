"""docs/writing-a-backend.md and its example backend cannot drift apart, and the example passes
the conformance suite when installed the way a third party installs it.

The doc shows every file of ``examples/ruvllm-example-backend`` in a fenced block whose info
string names it (```` ```python file=examples/... ````); the blocks must equal the files. The
example is then pip-installed into a throwaway directory (never the project's venv, whose
entry points every other test discovers) and ``ruvllm conformance example`` runs in a child
process that finds it only through ``PYTHONPATH``, i.e. through its entry point.
"""

from __future__ import annotations

import inspect
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import ruvllm.testing.suite as suite_package
from ruvllm.backend import LlmBackend
from ruvllm.plugins import AUTO_PREFERENCE

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "writing-a-backend.md"
EXAMPLE = ROOT / "examples" / "ruvllm-example-backend"
#: A fenced block that is a file of the repository: ```lang file=PATH ... ```
FILE_BLOCK = re.compile(r"^```\w+ file=(\S+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
#: A row of the doc's engine-test table: | `test_name` | needs | checks |
ENGINE_ROW = re.compile(r"^\| `(test_\w+)` \| ([\w-]+) \|", re.MULTILINE)
SUITE = Path(suite_package.__file__).parent
SUMMARY = re.compile(
    r"ruvllm conformance: backend example, model default: (\d+) passed, (\d+) skipped -> PASS")
SKIP_LINE = re.compile(r"^\s*SKIPPED\s+\w+::(\w+)\[example\]: (.+)$", re.MULTILINE)


def doc_text() -> str:
    return DOC.read_text(encoding="utf-8")


def example_files() -> set[str]:
    """The example's source files (build output of an in-place install is not source)."""
    return {
        p.relative_to(ROOT).as_posix() for p in EXAMPLE.rglob("*")
        if p.is_file() and (p.suffix == ".py" or p.name == "pyproject.toml")
        and not any(part in ("__pycache__", "build") or part.endswith(".egg-info")
                    for part in p.relative_to(EXAMPLE).parts)
    }


def test_doc_shows_every_example_file_verbatim() -> None:
    blocks = {path: body for path, body in FILE_BLOCK.findall(doc_text())}
    assert set(blocks) == example_files(), (
        "every file of the example must be shown in docs/writing-a-backend.md as a block "
        "```LANG file=PATH, and every such block must name an existing example file"
    )
    for path, body in blocks.items():
        assert body == (ROOT / path).read_text(encoding="utf-8"), (
            f"the block `file={path}` in docs/writing-a-backend.md differs from the file; "
            f"copy the file into the block"
        )


def engine_table() -> dict[str, str]:
    """The doc's engine tests: name -> what it needs ("-" or a capability)."""
    return dict(ENGINE_ROW.findall(doc_text()))


def test_doc_states_the_contract_as_the_code_has_it() -> None:
    """The facts the doc names that live in code: the executor signature, auto's order, the
    suite's files and its engine tests."""
    text = doc_text()
    sig = inspect.signature(LlmBackend.create_executor)
    assert str(sig) == "(self, *, max_sequences: 'int', block_size: 'int') -> 'BatchExecutor'", sig
    assert "def create_executor(self, *, max_sequences: int, block_size: int) -> BatchExecutor" in text
    for order in AUTO_PREFERENCE.values():
        assert f"`{', '.join(order)}`" in text, f"auto's order {order} is not in the doc"
    for module in SUITE.glob("test_*.py"):
        assert f"`{module.name}`" in text, f"the suite's {module.name} is not described"
    engine_source = (SUITE / "test_engine.py").read_text(encoding="utf-8")
    engine_tests = set(re.findall(r"^    def (test_\w+)", engine_source, re.MULTILINE))
    assert set(engine_table()) == engine_tests, "the doc's engine-test table must list test_engine.py's tests"


def _install_example(tmp_path: Path) -> Path:
    """pip-install a copy of the example (building in place would write into the repo) into a
    directory of its own; returns that directory."""
    src, site = tmp_path / "src", tmp_path / "site"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(site), str(src)],
        check=True, capture_output=True, text=True, timeout=300,
    )
    assert (site / "ruvllm_example_backend" / "backend.py").is_file()
    return site


# The whole suite on a real model in a child process: about a minute of CPU, several minutes of
# wall time on a busy 2-core machine, beyond the per-test default of pyproject.toml.
@pytest.mark.slow  # ~45 s of a child suite run: make test-all (make test stays under 15 minutes)
@pytest.mark.timeout(900)
def test_installed_example_passes_the_conformance_suite(tmp_path: Path) -> None:
    site = _install_example(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
        # Only the example's entry point: other plugins' state must not decide this test.
        "RUVLLM_PLUGINS": "example",
        "HF_HUB_OFFLINE": "1",
    }
    ruvllm = Path(sys.executable).with_name("ruvllm")
    command = [str(ruvllm)] if ruvllm.is_file() else [sys.executable, "-m", "ruvllm"]
    # n_threads=1: the numbers do not depend on it, and OpenMP threads crawl on a busy machine.
    proc = subprocess.run(
        [*command, "conformance", "example", "--ruvllm-option", "n_threads=1",
         "--ruvllm-option", "n_ctx=1024"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=840,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    summary = SUMMARY.search(out)
    assert summary, out[-3000:]
    passed, skipped = int(summary.group(1)), int(summary.group(2))
    skips = dict(SKIP_LINE.findall(out))
    # Skipped: exactly the engine tests the doc says need an executor, the KV-pool test the doc
    # says needs one (demand beyond the engine's pool), and the batch-invariance class the doc says
    # runs only for a backend claiming the mode, each saying why.
    executor_only = {name for name, needs in engine_table().items() if needs == "executor"}
    executor_only.add("test_demand_beyond_the_pool_completes_every_request")
    invariance = "test_every_answer_is_the_one_given_alone"
    assert executor_only and set(skips) == executor_only | {invariance}, skips
    assert all("no iteration-level executor" in skips[name] for name in executor_only), skips
    assert "lacks batch_invariant_mode" in skips[invariance], skips
    assert skipped == len(executor_only) + 1 and passed >= 50, (passed, skipped)
