"""The import layering of pyproject.toml's ``[tool.importlinter]`` holds, and the check really fails.

``lint-imports`` runs the contracts: core's layers (front ends above the engine and the LLM facade,
those above core's shared modules), no cycle between siblings at any depth, no server API surface
importing another, the server's lifecycle and http packages importing no surface, core importing
no plugin, backend plugins independent. The second test runs the same contracts over a copy of
core with a deliberate upward import, a deliberate cycle (the two the code used to have:
``guided/`` importing the server, and ``server/extensions/lora.py`` <->
``server/lifecycle/model_pool.py``), one surface importing another (Ollama's through OpenAI's
Responses API) and the lifecycle speaking a surface's dialect (its embeddings writing OpenAI's
list, as they once did), and expects each to be reported: a check that cannot fail would prove
nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(cwd: Path, *, pythonpath: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if pythonpath is not None:  # ahead of the editable install's path: the copy is what is read
        env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([str(LINT_IMPORTS), "--no-cache", "--no-logo"], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=240)


def test_the_code_keeps_its_layers():
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Contracts: 6 kept, 0 broken." in result.stdout, result.stdout


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + text)


def test_an_upward_import_and_a_cycle_break_the_contracts(tmp_path):
    shutil.copytree(ROOT / "core" / "ruvllm", tmp_path / "core" / "ruvllm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    copy = tmp_path / "core" / "ruvllm"
    # Function-level imports count too: a cycle hidden in a function is still a cycle.
    _append(copy / "guided" / "grammar.py", "\n\ndef _probe():\n    import ruvllm.server.http.sse  # noqa\n")
    _append(copy / "server" / "lifecycle" / "model_pool.py",
            "\n\ndef _probe():\n    import ruvllm.server.extensions.lora  # noqa\n")
    _append(copy / "server" / "ollama" / "ollama_api.py",
            "\n\ndef _probe():\n    import ruvllm.server.openai.responses_api  # noqa\n")
    _append(copy / "server" / "lifecycle" / "embeddings.py",
            "\n\ndef _probe():\n    import ruvllm.server.openai.embeddings  # noqa\n")
    result = lint_imports(tmp_path, pythonpath=tmp_path / "core")
    out = result.stdout
    assert result.returncode != 0, out
    assert "Contracts: 2 kept, 4 broken." in out, out
    assert "ruvllm.guided is not allowed to import ruvllm.server" in out, out  # the layers
    assert "- ruvllm.guided.grammar -> ruvllm.server.http.sse" in out, out
    assert "No cycles are allowed in ruvllm.server." in out, out  # the cycle, found one level down
    assert "- .lifecycle -> .extensions" in out, out
    assert "ruvllm.server.ollama is not allowed to import ruvllm.server.openai" in out, out  # a surface
    assert "- ruvllm.server.ollama.ollama_api -> ruvllm.server.openai.responses_api" in out, out
    # The lifecycle importing a surface (the first probe's extensions counts too, so name this one).
    assert "ruvllm.server.lifecycle is not allowed to import ruvllm.server.openai" in out, out
    assert "-   ruvllm.server.lifecycle.embeddings -> ruvllm.server.openai.embeddings" in out, out
