"""The conformance suite over every real backend installed in this environment.

Backends are discovered, not listed: a plugin that registers a backend through the ``ruvllm``
entry point is picked up here as soon as it is installed (``--ruvllm-backend all``). Backends
that cannot run on this machine are skipped by the suite with their own reason.
"""

from __future__ import annotations

import pytest
from ruvllm.plugins import get_registry


def available_backends() -> list[str]:
    registry = get_registry()
    return sorted(n for n, cls in registry.backends.items() if cls.unavailable_reason() is None)


def test_suite_passes_on_every_installed_backend(suite_runner) -> None:
    names = available_backends()
    if not names:
        reasons = "; ".join(f"{f.plugin}: {f.reason}" for f in get_registry().failures)
        pytest.skip(f"no real backend is installed and available here ({reasons or 'no plugin'})")
    run = suite_runner("--ruvllm-backend", "all", toys=False)
    bad = {k: o.message for k, o in run.outcomes.items() if o.outcome in ("failed", "error")}
    assert not bad, (bad, run.tail(6000))
    for name in names:
        mine = {k: o for k, o in run.outcomes.items() if f"[{name}" in k}
        # Every KV-reset test ran on it (a cached_tokens or RSS skip must state its reason).
        for key, o in mine.items():
            if key.startswith("TestKvReset::"):
                assert o.outcome == "passed" or (o.outcome == "skipped" and o.message), (key, o)
        assert sum(o.outcome == "passed" for o in mine.values()) >= 30, (name, mine)
        assert all(o.message for o in mine.values() if o.outcome == "skipped"), mine
    assert run.result.ret == pytest.ExitCode.OK

