"""Grammar-library calls and the compile child's fork never overlap.

A grammar compile runs in a forked child so that it can be killed at its time limit
(:mod:`ruvllm.guided.compile`). A fork copies the memory of every thread but runs only the
forking one: a lock that another thread held inside llguidance or xgrammar at that instant stays
locked in the child forever, and the child's compile hangs until it is killed. Measured on the
embedded model's vocabulary: 5 of 40 children hung while two threads compiled grammars in the
parent, 1 of 40 while a thread filled masks, so valid grammars were refused as too slow.

Every call into a grammar library therefore runs under :func:`library_call` (any number at once),
and a fork under :func:`forking`, which waits until no call is running and holds new ones back
for the few milliseconds a fork takes.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_state = threading.Condition()
_calls = 0
_forks = 0


@contextlib.contextmanager
def library_call() -> Iterator[None]:
    """Around a call into llguidance or xgrammar (compile, matcher creation, masks, tokens)."""
    global _calls
    with _state:
        while _forks:
            _state.wait()
        _calls += 1
    try:
        yield
    finally:
        with _state:
            _calls -= 1
            if not _calls:
                _state.notify_all()


@contextlib.contextmanager
def forking() -> Iterator[None]:
    """Around the start of a compile child: no library call runs in another thread meanwhile."""
    global _forks
    with _state:
        _forks += 1
        try:
            while _calls:
                _state.wait()
            yield
        finally:
            _forks -= 1
            _state.notify_all()
