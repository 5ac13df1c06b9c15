"""Hand-offs from the model thread to an event loop are coalesced and keep their order."""

from __future__ import annotations

import asyncio
import threading

from ruvllm.engine.handles import AsyncSink
from ruvllm.types import TokenOutput


def test_pushes_from_another_thread_arrive_in_order_with_one_wake_up_per_burst():
    async def main():
        loop = asyncio.get_running_loop()
        wakeups = 0
        real = loop.call_soon_threadsafe

        def counting(cb, *args):
            nonlocal wakeups
            wakeups += 1
            return real(cb, *args)

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        sinks = [AsyncSink(loop) for _ in range(8)]

        def model_thread():  # one "step": every request gets a token, the loop is not running meanwhile
            for step in range(3):
                for i, sink in enumerate(sinks):
                    sink.push([TokenOutput(index=step, token_id=100 * i + step, text=str(step))])

        t = threading.Thread(target=model_thread)
        t.start()
        t.join()  # the loop was blocked on join: all 24 pushes are waiting in one drain
        assert wakeups == 1
        got = []
        for sink in sinks:
            got.append([(await sink.queue.get()).token_id for _ in range(3)])
        assert got == [[100 * i + s for s in range(3)] for i in range(8)]
        # After the drain a new push schedules a new wake-up.
        sinks[0].push([TokenOutput(index=3, token_id=7, text="x")])
        assert (await asyncio.wait_for(sinks[0].queue.get(), 5)).token_id == 7
        assert wakeups == 2

    asyncio.run(main())
