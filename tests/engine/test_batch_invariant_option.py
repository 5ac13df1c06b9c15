"""``[engine] batch_invariant`` on backends without the mode: refused by name where requests
share forward passes, held (and reported) where the engine serves one request at a time."""

from __future__ import annotations

import pytest
from engine_fakes import FakeBackend
from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.errors import BatchInvariantUnsupported, EngineOptionError

MODE = EngineOptions(batch_invariant=True, max_num_seqs=2)


@pytest.mark.parametrize(("executor", "concurrent"), [(True, False), (False, True)],
                         ids=["batched-executor", "concurrent-request-level"])
def test_a_backend_whose_requests_share_a_batch_refuses_the_mode(executor: bool, concurrent: bool) -> None:
    with pytest.raises(BatchInvariantUnsupported) as err:
        ServingEngine(FakeBackend(executor_capable=executor, concurrent=concurrent), MODE)
    assert isinstance(err.value, EngineOptionError) and err.value.option == "batch_invariant"
    assert "'fake'" in str(err.value)


@pytest.mark.parametrize(("executor", "options"), [(False, MODE), (True, EngineOptions(batch_invariant=True,
                                                                                   path="request"))],
                         ids=["no-executor", "executor-not-used"])
def test_one_request_at_a_time_holds_the_mode(executor: bool, options: EngineOptions) -> None:
    engine = ServingEngine(FakeBackend(executor_capable=executor), options)
    try:
        assert engine.path == "request" and engine.capabilities.batch_invariant
    finally:
        engine.close()


def test_the_mode_is_off_by_default() -> None:
    engine = ServingEngine(FakeBackend())
    try:
        assert not engine.capabilities.batch_invariant
    finally:
        engine.close()
