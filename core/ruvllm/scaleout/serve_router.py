"""The prefix-affinity policy as a Ray Serve request router.

Serve (2.4x+) lets a deployment name its own ``RequestRouter`` (``request_router_config``). It
runs inside every caller's ``DeploymentHandle`` (here: the ingress), sees each pending
request's arguments and the replicas' queue lengths, and returns ranked replicas; Serve then
tries each rank in order, skipping replicas at ``max_ongoing_requests``, and handles replica
death, backoff and autoscaled replica sets. So routing stays a policy (``prefix_router``) and
the replica set, health and queue probing stay Serve's.
"""

from __future__ import annotations

from typing import Any

from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica

from ruvllm.scaleout.prefix_router import AffinityPolicy
from ruvllm.scaleout.wire import FeedbackCall, ReplicaRequest


def request_of(pending: PendingRequest | None) -> ReplicaRequest | FeedbackCall | None:
    if pending is None:
        return None
    for arg in (*pending.args, *pending.kwargs.values()):
        if isinstance(arg, (ReplicaRequest, FeedbackCall)):
            return arg
    return None


class PrefixAffinityRouter(RequestRouter):
    """Home replica of the prompt's prefix first; least-loaded when it is busy or unkeyed.
    Feedback goes to the replica that served its request (any, if that one is gone: it then
    answers that it does not hold the request)."""

    def initialize_state(self, busy_threshold: int = 4, **_: Any) -> None:
        self._policy = AffinityPolicy(busy_threshold=busy_threshold)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        by_id = {r.replica_id.to_full_id_str(): r for r in candidate_replicas}
        loads = {rid: self.replica_queue_len_cache.get(r.replica_id) for rid, r in by_id.items()}
        request = request_of(pending_request)
        if isinstance(request, FeedbackCall) and request.replica_id in by_id:
            return [[by_id[request.replica_id]]]
        key = request.prefix_key if isinstance(request, ReplicaRequest) else None
        ranks = self._policy.rank(key, loads)
        return [[by_id[rid] for rid in rank] for rank in ranks]
