"""Ray Serve settings (environment variables) of the processes ``ruvllm serve --ray`` runs.

Serve reads them when a process imports it, so they must be in the process's environment: the
replicas get ``SERVE_ENV`` through their deployment's ``runtime_env``
(``ScaleOutSettings.serve_env``); the process of ``ruvllm serve --ray``, which serves HTTP and
calls the replicas through its DeploymentHandle, sets ``FRONT_ENV`` in its own environment
before it imports Serve. No Ray import here.

What each buys, measured on the namespace cluster (benchmarks/multi_node.py; docs/scale-out.md,
"Across nodes", has the hop-by-hop breakdown):

- ``RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0``, ``RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0``:
  user code and the router on the process's own event loop instead of a loop each in another
  thread (every request crossed two threads' loops in the ingress and one in the replica).
  The cost: user code that blocks its loop also holds Serve's own calls (health checks,
  queue-length probes); ruvllm's blocking work runs on the engine's model thread and the
  ingress's tokenizer thread.
- ``RAY_SERVE_USE_GRPC_BY_DEFAULT=1``: calls from the HTTP process to a replica (and each
  streamed item back) travel over Serve's direct gRPC channel to the
  replica instead of as Ray actor tasks whose streamed items are reported through the owner's
  object table. Serve maps a replica that dies under a call to ``ActorUnavailableError``, which
  the resend logic already treats as a lost replica; cancelling the call cancels the replica's
  generator as before.
- ``RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH``: that channel refuses messages above 4 MiB by
  default; Ray's object path had no such cap, and a final result with logprobs, an embeddings
  batch can exceed it. Raised to gRPC's ceiling, as Serve's own proxy servers are
  (``RAY_SERVE_GRPC_MAX_MESSAGE_SIZE``).
"""

from __future__ import annotations

_GRPC = {"RAY_SERVE_USE_GRPC_BY_DEFAULT": "1", "RAY_SERVE_REPLICA_GRPC_MAX_MESSAGE_LENGTH": str(2**31 - 1)}

#: Environment of the replicas' processes (``ScaleOutSettings.serve_env``'s default).
SERVE_ENV = {"RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD": "0", "RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0",
             **_GRPC}
#: Environment of the process serving HTTP: its handle to the replicas routes on that process's own
#: loop and calls over gRPC.
FRONT_ENV = {"RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP": "0", **_GRPC}
