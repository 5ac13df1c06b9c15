"""pytest plugin behind the conformance suite: options, backend parametrisation, fixtures.

It is registered for every pytest run in an environment where ruvllm is installed (``pytest11``
entry point), so importing it must cost nothing: only pytest and the standard library are
imported here; ruvllm, numpy and the engines load the first time a suite test needs a backend.

Backends are chosen with ``--ruvllm-backend`` (repeatable):

- ``NAME``: a backend registered in :func:`ruvllm.plugins.get_registry` (by its plugin's entry
  point, or in-process with ``get_registry().register_backend(cls)`` from a ``-p`` plugin or a
  conftest);
- ``all``: every registered backend; those that cannot run here are reported as skipped with
  their reason;
- ``package.module:ClassName``: a backend class imported and registered on the spot, for an
  author whose plugin is not packaged yet.

Without the option the suite's tests are collected and skipped, each saying how to select a
backend. Every suite test depends on ``ruvllm_backend_name``, which this plugin parametrises
with session scope, so pytest groups the tests by backend and each model is loaded once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from ruvllm.backend import LlmBackend
    from ruvllm.llm import LLM
    from ruvllm.models import ModelSource

ALL = "all"
DEFAULT_MODEL = "default"
NO_BACKEND_REASON = (
    "no backend selected for the ruvllm conformance suite: pass --ruvllm-backend NAME "
    "(repeatable, or 'all' for every installed backend), or run `ruvllm conformance NAME`"
)
_PLAN_KEY = "_ruvllm_backend_plan"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ruvllm", "ruvllm backend conformance suite")
    group.addoption(
        "--ruvllm-backend", action="append", default=[], metavar="NAME",
        help="backend to run the conformance suite on (repeatable): a registered name, 'all', "
             "or package.module:ClassName",
    )
    group.addoption(
        "--ruvllm-model", default=DEFAULT_MODEL, metavar="REF",
        help="model the suite loads on each backend (default: the embedded model)",
    )
    group.addoption(
        "--ruvllm-option", action="append", default=[], metavar="KEY=VALUE",
        help="backend option passed to every backend the suite loads (repeatable)",
    )
    group.addoption(
        "--ruvllm-engine-option", action="append", default=[], metavar="KEY=VALUE",
        help="[engine] option of every ServingEngine the suite builds (repeatable; a test's own "
             "settings win), e.g. speculative_method=ngram to run the engine tests speculating",
    )
    group.addoption(
        "--ruvllm-max-context", type=int, default=None, metavar="TOKENS",
        help="the KV-pool tests' context at most this (the engine's pool is lowered to it): a "
             "quicker run; without it they use the whole context the engine states",
    )


def pytest_report_header(config: pytest.Config) -> list[str] | None:
    specs = config.getoption("ruvllm_backend")
    if not specs:
        return None
    plan = backend_plan(config)
    lines = [f"ruvllm conformance: model {config.getoption('ruvllm_model')!r}"]
    for name, reason in plan:
        lines.append(f"  backend {name}: " + ("selected" if reason is None else f"skipped ({reason})"))
    return lines


def load_backend_class(spec: str) -> type[LlmBackend]:
    """Import ``package.module:ClassName`` and register it, so it is selectable by name."""
    from ruvllm.backend import LlmBackend
    from ruvllm.plugins import get_registry

    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise pytest.UsageError(
            f"--ruvllm-backend {spec}: cannot import it ({type(exc).__name__}: {exc}); "
            f"give package.module:ClassName of an LlmBackend subclass importable from here"
        ) from None
    if not (isinstance(obj, type) and issubclass(obj, LlmBackend)):
        raise pytest.UsageError(f"--ruvllm-backend {spec}: {obj!r} is not an LlmBackend subclass")
    get_registry().register_backend(obj, provider=module_name)
    return obj


def resolve_backend_specs(specs: list[str]) -> list[tuple[str, str | None]]:
    """(backend name, reason to skip it or None) for each selected backend, in order."""
    from ruvllm.errors import UnknownBackend
    from ruvllm.plugins import get_registry, why_unavailable

    registry = get_registry()
    plan: dict[str, str | None] = {}
    for spec in specs:
        if spec == ALL:
            if not registry.backends:
                plan.setdefault("none-installed", "no ruvllm backend is installed in this environment")
            for name in sorted(registry.backends):
                reason = why_unavailable(registry.backends[name])
                plan.setdefault(name, None if reason is None else f"{name} is unavailable here: {reason}")
        elif ":" in spec:
            plan.setdefault(load_backend_class(spec).name, None)
        elif spec in registry.backends:
            plan.setdefault(spec, None)
        else:
            # An explicitly named backend that does not exist is a usage error, not a skip:
            # a conformance run that skips everything would look like a pass.
            raise pytest.UsageError(str(UnknownBackend(spec, list(registry.backends))))
    return list(plan.items())


def backend_plan(config: pytest.Config) -> list[tuple[str, str | None]]:
    """The resolved backend selection, computed once per session (after conftests loaded)."""
    plan = getattr(config, _PLAN_KEY, None)
    if plan is None:
        specs = config.getoption("ruvllm_backend")
        plan = resolve_backend_specs(specs) if specs else []
        setattr(config, _PLAN_KEY, plan)
    return plan


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "ruvllm_backend_name" not in metafunc.fixturenames:
        return
    plan = backend_plan(metafunc.config)
    if not plan:
        params = [pytest.param(None, id="no-backend", marks=pytest.mark.skip(reason=NO_BACKEND_REASON))]
    else:
        params = [
            pytest.param(name, id=name, marks=() if reason is None else pytest.mark.skip(reason=reason))
            for name, reason in plan
        ]
    metafunc.parametrize("ruvllm_backend_name", params, indirect=True, scope="session")


@pytest.fixture(scope="session")
def ruvllm_backend_name(request: pytest.FixtureRequest) -> str:
    """Name of the backend under test (parametrised by this plugin)."""
    return request.param


@pytest.fixture(scope="session")
def ruvllm_model_source(pytestconfig: pytest.Config) -> ModelSource:
    """The model every backend loads, resolved once from ``--ruvllm-model``."""
    from ruvllm.config import load_config
    from ruvllm.registry import resolve

    return resolve(pytestconfig.getoption("ruvllm_model"), load_config().cache_dir)


@pytest.fixture(scope="session")
def ruvllm_backend_options(pytestconfig: pytest.Config) -> dict[str, Any]:
    from ruvllm.config import parse_option

    return dict(parse_option(text) for text in pytestconfig.getoption("ruvllm_option"))


@pytest.fixture(scope="session")
def ruvllm_engine_options(pytestconfig: pytest.Config) -> Callable[..., Any]:
    """``ruvllm_engine_options(**fixed)``: the EngineOptions a suite test builds, what the test
    fixes over the ``--ruvllm-engine-option`` ones."""
    from ruvllm.config import parse_option
    from ruvllm.engine import EngineOptions

    given = dict(parse_option(text) for text in pytestconfig.getoption("ruvllm_engine_option"))

    def make(**fixed: Any) -> Any:
        return EngineOptions.from_mapping({**given, **fixed})

    return make


@pytest.fixture(scope="session")
def ruvllm_max_context(pytestconfig: pytest.Config) -> int | None:
    """``--ruvllm-max-context``: the KV-pool tests' context cap (None: the engine's own)."""
    cap = pytestconfig.getoption("ruvllm_max_context")
    if cap is not None and cap < 64:
        raise pytest.UsageError(f"--ruvllm-max-context {cap}: give at least 64 tokens")
    return cap


@pytest.fixture(scope="session")
def ruvllm_llm(ruvllm_backend_name: str, ruvllm_model_source: ModelSource,
               ruvllm_backend_options: dict[str, Any]):
    """One loaded :class:`ruvllm.LLM` per backend for the whole session, closed at the end.

    A load failure is an error of every test of that backend, never a skip: a backend the
    user asked for that cannot load has failed conformance.
    """
    from ruvllm.llm import LLM

    llm: LLM = LLM(ruvllm_model_source, backend=ruvllm_backend_name, options=ruvllm_backend_options)
    try:
        yield llm
    finally:
        llm.close()
