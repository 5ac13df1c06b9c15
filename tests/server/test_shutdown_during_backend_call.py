"""SIGTERM while a backend call cannot be interrupted: the server still exits.

A request-level backend (mistral.rs) prefills a long prompt inside one call that ruvllm cannot
interrupt; on this CPU a 3,900-token prompt takes minutes. The server used to wait for the model
thread to finish that call before exiting, so ``ruvllm serve`` ignored SIGTERM until the prefill
ended. The fake backend here blocks before its first token: the engine logic under test is the
shutdown, not the model. The stuck case runs in a child process, because what must not happen
is a thread left joining the model thread that keeps the process from exiting.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from ruvllm.engine import EngineOptions, ServingEngine
from ruvllm.server.lifecycle.model_pool import ModelPool

FAKES = Path(__file__).resolve().parents[1] / "engine"
sys.path.insert(0, str(FAKES))
from engine_fakes import FakeBackend  # noqa: E402

STUCK_SERVER = textwrap.dedent("""
    import asyncio, logging, sys, threading
    sys.path.insert(0, {fakes!r})
    from engine_fakes import FakeBackend
    from ruvllm.engine import EngineOptions, ServingEngine
    from ruvllm.server.lifecycle.model_pool import ModelPool
    from ruvllm.types import GenerationParams

    class StuckBackend(FakeBackend):
        entered = threading.Event()

        def generate(self, prompt_ids, params):
            self.entered.set()
            threading.Event().wait(120)  # a prefill of minutes
            yield from super().generate(prompt_ids, params)

    logging.basicConfig(level=logging.WARNING)
    backend = StuckBackend(executor_capable=False)
    engine = ServingEngine(backend, EngineOptions(path="request"), owns_backend=True)
    pool = ModelPool.single(engine, "m")
    pool.shutdown_grace = 0.5
    engine.submit_sync([1, 2, 3], GenerationParams(max_tokens=4))
    assert backend.entered.wait(10)
    asyncio.run(pool.shutdown())
    print("shutdown returned", flush=True)
""")


def test_the_process_exits_while_its_backend_is_stuck_in_a_call():
    start = time.monotonic()
    child = subprocess.run([sys.executable, "-c", STUCK_SERVER.format(fakes=str(FAKES))],
                           capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert child.returncode == 0, child.stderr
    assert "shutdown returned" in child.stdout
    assert "still inside a backend call after 0.5 s" in child.stderr
    assert took < 30, f"the process took {took:.0f} s to exit: something still waited for the stuck call"


def test_server_shutdown_waits_for_an_engine_that_stops_in_time():
    backend = FakeBackend(executor_capable=False)
    engine = ServingEngine(backend, EngineOptions(path="request"), owns_backend=True)
    pool = ModelPool.single(engine, "m")
    asyncio.run(pool.shutdown())
    assert backend.closed and not engine._thread.is_alive()
