"""What crosses the process boundary between the ingress and the replicas.

Requests and descriptions are small attrs values (cloudpickled by Ray). Errors travel as
values, not as raised exceptions: ruvllm's error classes take field-specific constructor
arguments, which a plain pickle round trip does not replay, and Ray would otherwise wrap them
in ``RayTaskError``. :func:`pack_error` / :func:`unpack_error` keep the class, message and
attributes, so the ingress answers with the same status code and OpenAI error body as a
single-process server.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import attrs

from ruvllm.errors import BackendError, RuvllmError
from ruvllm.guided.grammar import GrammarSpec
from ruvllm.types import Capabilities, GenerationParams, ModelInfo


@attrs.frozen(kw_only=True)
class ReplicaRequest:
    """One engine request as the ingress sends it to a replica."""

    prompt_ids: tuple[int, ...]
    params: GenerationParams
    request_id: str
    priority: int = 0
    timeout: float | None = None
    cache_salt: str | None = None
    #: Hash of the prompt's first KV blocks (``prefix_router.prefix_key``), read by the router.
    prefix_key: str | None = None
    #: The recipes of the request's grammar processors (``GuidedProcessor.recipe``): the replica
    #: rebuilds one processor per recipe with its own tokenizer and grammar engine, since the
    #: ingress's compiled matchers cannot leave its process.
    grammars: tuple[GrammarSpec, ...] = ()
    #: The client's predicted output (token ids), drafted by the replica's engine.
    prediction: tuple[int, ...] = ()


@attrs.frozen(kw_only=True)
class ReplicaDescription:
    """What the ingress needs to know about the model the replicas serve."""

    info: ModelInfo
    capabilities: Capabilities
    backend_name: str
    path: str
    #: The engine's scheduling policy value ("fcfs", "priority"...), for ``priority`` requests.
    policy: str
    block_size: int
    replica_id: str
    pid: int
    #: Why one request gets less than the model's context on a replica ("" when it does not).
    context_limit_note: str = ""
    #: The KV memory one replica sized from a setting, for the start-up banner.
    memory: str | None = None
    #: Why ``auto`` picked the replicas' backend (None when it was named).
    backend_choice: str | None = None


@attrs.frozen(kw_only=True)
class FeedbackCall:
    """A user's score for a finished request, for the replica that served it: the router sends it
    to ``replica_id`` only (``serve_router``), where the learning plugin keeps the request."""

    request_id: str
    score: float
    replica_id: str


@attrs.frozen
class Accepted:
    """First item of every replica stream: the engine took the request (submit succeeded)."""

    replica_id: str
    pid: int


@attrs.frozen
class WireError:
    """A ruvllm error raised in a replica, carried as a value."""

    module: str
    qualname: str
    message: str
    state: dict[str, Any]


def pack_error(exc: BaseException) -> WireError:
    if not isinstance(exc, RuvllmError):
        exc = BackendError(f"{type(exc).__name__}: {exc}")
    state = {k: v for k, v in vars(exc).items() if _plain(v)}
    return WireError(type(exc).__module__, type(exc).__qualname__, str(exc), state)


def unpack_error(err: WireError) -> RuvllmError:
    """The replica's error rebuilt in this process (a BackendError if its class is unknown here)."""
    try:
        cls = getattr(importlib.import_module(err.module), err.qualname)
    except (ImportError, AttributeError):
        return BackendError(err.message)
    if not (isinstance(cls, type) and issubclass(cls, RuvllmError)):
        return BackendError(err.message)
    exc = cls.__new__(cls)
    Exception.__init__(exc, err.message)
    vars(exc).update(err.state)
    return exc


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (str, int, float, bool)):
        return True
    if isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return all(_plain(v) for v in value)
    return False
