"""The backend conformance suite: proof that a backend keeps the :class:`LlmBackend` contract.

Run it on an installed backend with ``ruvllm conformance NAME`` or
``pytest --pyargs ruvllm.testing.suite --ruvllm-backend NAME`` (see docs/conformance.md).

- :mod:`ruvllm.testing.suite`: the tests, parametrised over the selected backends;
- :mod:`ruvllm.testing.pytest_plugin`: options and fixtures (loaded by pytest automatically);
- :mod:`ruvllm.testing.runner`: :func:`run_conformance`, what the CLI calls.

Nothing heavy is imported here: pytest loads the plugin in every run of this environment.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["run_conformance"]


def run_conformance(backend: str, model: str | None = None, extra_pytest_args: Sequence[str] = ()) -> int:
    """Run the suite on ``backend`` (with ``model``, default: the embedded one) and return
    pytest's exit code; see :func:`ruvllm.testing.runner.run_conformance`."""
    from ruvllm.testing.runner import run_conformance as run

    return run(backend, model, extra_pytest_args)
