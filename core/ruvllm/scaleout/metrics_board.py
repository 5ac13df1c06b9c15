"""Per-replica engine metrics, gathered where the ingress can read them.

A DeploymentHandle cannot address one particular replica, so the ingress cannot ask each
replica for its counters. Instead every replica posts its :class:`MetricsSnapshot` to a small
named, detached actor (zero CPUs) after each request it finishes; the ingress reads
the latest snapshot of every replica from it. That gives ``/metrics`` (the sum over replicas:
counters over every replica that reported, gauges over those still alive, see :func:`combine`)
and ``/ray/replicas`` (per replica: prefix-cache queries and hits, pid), which is how the tests
see which replica served a shared prefix.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import attrs

from ruvllm.serving import Histogram, MetricsSnapshot, PluginMetric

NAMESPACE = "ruvllm"
#: Ray's resource of the head node: what must outlive any worker node (the board) asks for a
#: sliver of it.
HEAD_RESOURCE = "node:__internal_head__"


@attrs.frozen(kw_only=True)
class ReplicaMetrics:
    replica_id: str
    pid: int
    snapshot: MetricsSnapshot
    reported_at: float
    #: Address of the node the replica runs on ("" when unknown).
    node_ip: str = ""
    #: Feedback calls (``/v1/feedback``) the replica received: where feedback went.
    feedback: int = 0
    #: Serve stopped the replica (a redeploy, a downscale): its gauges no longer count.
    retired: bool = False


class MetricsBoard:
    """Ray actor body: the latest snapshot posted by each replica."""

    def __init__(self) -> None:
        self._latest: dict[str, ReplicaMetrics] = {}

    def report(self, replica_id: str, pid: int, snapshot: MetricsSnapshot, node_ip: str = "",
               feedback: int = 0) -> None:
        self._latest[replica_id] = ReplicaMetrics(replica_id=replica_id, pid=pid, snapshot=snapshot,
                                                  reported_at=time.time(), node_ip=node_ip, feedback=feedback)

    def retire(self, replica_id: str) -> None:
        """The replica was stopped: keep its counters, drop its gauges (see ``current``)."""
        if replica_id in self._latest:
            self._latest[replica_id] = attrs.evolve(self._latest[replica_id], retired=True)

    def latest(self) -> dict[str, ReplicaMetrics]:
        return dict(self._latest)


def start_board(name: str) -> Any:
    """The board actor called ``name``, created if it does not exist.

    Detached: a restarted ``ruvllm serve --ray`` (the ingress) finds the same board, and the
    replicas' cached handles stay valid. It lives until Ray stops or ``kill_board``; a redeploy
    under the same name reuses it. It runs on the head node (``HEAD_RESOURCE``), so the counters
    of every node outlive any worker node.
    """
    import ray

    return ray.remote(num_cpus=0)(MetricsBoard).options(
        name=name, namespace=NAMESPACE, get_if_exists=True, lifetime="detached",
        resources={HEAD_RESOURCE: 0.001}).remote()


def kill_board(name: str) -> None:
    """Remove the board of a deleted application (``serve.delete``) from a long-lived cluster."""
    import ray

    with contextlib.suppress(ValueError):
        ray.kill(ray.get_actor(name, namespace=NAMESPACE))


_boards: dict[str, Any] = {}


def _board(name: str) -> Any | None:
    """The board's handle (cached), None while it does not exist."""
    import ray

    board = _boards.get(name)
    if board is None:
        try:
            board = _boards[name] = ray.get_actor(name, namespace=NAMESPACE)
        except ValueError:
            return None
    return board


def report_to_board(name: str, replica_id: str, pid: int, snapshot: MetricsSnapshot,
                    node_ip: str = "", feedback: int = 0) -> None:
    """Post ``snapshot`` without waiting; a board that does not exist (yet) is skipped."""
    board = _board(name)
    if board is None:
        return
    try:
        board.report.remote(replica_id, pid, snapshot, node_ip, feedback)
    except Exception:  # the board's owner (the ingress) is restarting: look it up again next time
        _boards.pop(name, None)


def retire_on_board(name: str, replica_id: str) -> None:
    """Tell the board that Serve stopped this replica, without waiting (best effort: a replica
    that dies instead leaves the gauges when a stream of it fails, or after ``STALE_AFTER``)."""
    with contextlib.suppress(Exception):
        board = _board(name)
        if board is not None:
            board.retire.remote(replica_id)


def _sum_histograms(hs: list[Histogram]) -> Histogram:
    first = hs[0]
    if any(h.buckets != first.buckets for h in hs):
        return first  # cannot add different bucket layouts; never the case for one engine version
    return Histogram(buckets=first.buckets,
                     counts=tuple(sum(c) for c in zip(*(h.counts for h in hs), strict=True)),
                     sum=sum(h.sum for h in hs), count=sum(h.count for h in hs))


#: Seconds after its last report when a replica's gauges (running, waiting, KV usage and
#: tokens) stop counting in ``/metrics``, unless this ingress has a request running on it.
#: Replicas report when they finish a request (there is no heartbeat), so one that serves traffic
#: reports far more often; one that has finished nothing for this long and runs nothing of ours
#: is dead or idle. Idle, its running and waiting are 0 anyway; what leaves the sum with it is
#: its KV capacity, until its next report. Its counters (totals) stay summed either way.
STALE_AFTER = 30.0

#: Snapshot fields that describe the replica now, not what it has done.
GAUGES = ("running", "waiting", "kv_usage", "kv_capacity_tokens", "kv_used_tokens", "prefix_cache_prompts",
          "prefix_cache_host_bytes")


def current(latest: Mapping[str, ReplicaMetrics], *, now: float, stale_after: float = STALE_AFTER,
            busy: Collection[str] = (), lost: Mapping[str, float] | None = None) -> list[ReplicaMetrics]:
    """The reports among ``latest`` whose gauges still describe a live replica: reported within
    ``stale_after`` seconds of ``now`` or running a request of this ingress (``busy``: a dead
    replica's streams fail at once, so it leaves ``busy`` at once), and not seen dying after the
    report (``lost``: replica id -> when a stream of it failed because it died), and not stopped
    by Serve (``retired``: else a redeploy's old replicas would count beside the new ones for
    ``stale_after`` seconds)."""
    lost = lost or {}
    return [m for m in latest.values()
            if not m.retired and lost.get(m.replica_id, float("-inf")) < m.reported_at
            and (m.replica_id in busy or now - m.reported_at <= stale_after)]


def combine(snapshots: Sequence[MetricsSnapshot],
            gauges: Sequence[MetricsSnapshot] | None = None) -> MetricsSnapshot | None:
    """The sum of several replicas' snapshots, None for none.

    Counters (requests, tokens, prefix-cache lookups, histograms) add up over ``snapshots``,
    every replica that ever reported, dead ones included: a total must not shrink because a
    replica died. Gauges (``GAUGES``: running, waiting, KV tokens, kept prompts and their bytes;
    ``kv_usage`` their mean) add up over ``gauges`` only (default: ``snapshots``), the replicas
    still alive (see :func:`current`); 0 where there is none. Plugins' figures follow their kind."""
    if not snapshots:
        return None
    gauges = snapshots if gauges is None else gauges
    finished: dict[str, int] = {}
    for s in snapshots:
        for reason, n in s.requests_finished.items():
            finished[reason] = finished.get(reason, 0) + n
    hist = {f: _sum_histograms([getattr(s, f) for s in snapshots])
            for f in ("time_to_first_token", "time_per_output_token", "inter_token_latency",
                      "e2e_latency", "queue_time")}
    total = {f: sum(getattr(s, f) for s in snapshots)
             for f in ("prefix_cache_queries", "prefix_cache_hits", "preemptions", "prompt_tokens",
                       "generation_tokens", "spec_decode_drafts", "spec_decode_draft_tokens",
                       "spec_decode_accepted_tokens")}
    now = {f: sum(getattr(s, f) for s in gauges)
           for f in GAUGES if f != "kv_usage"}
    kv_usage = sum(s.kv_usage for s in gauges) / len(gauges) if gauges else 0.0
    return MetricsSnapshot(**hist, **total, **now, kv_usage=kv_usage, requests_finished=finished,
                           plugins=_sum_plugins(snapshots, gauges))


def _sum_plugins(snapshots: Sequence[MetricsSnapshot],
                 gauges: Sequence[MetricsSnapshot]) -> tuple[PluginMetric, ...]:
    """Plugins' figures added up as the engine's are: counters over every replica that reported,
    gauges over the live ones (a gauge only dead replicas reported reads 0). A name fixes its
    kind (``PluginMetric`` checks the ``_total`` suffix)."""
    first: dict[str, PluginMetric] = {}
    for snap in (*snapshots, *gauges):
        for metric in snap.plugins:
            first.setdefault(metric.name, metric)

    def total(metric: PluginMetric) -> float:
        group = snapshots if metric.kind == "counter" else gauges
        return sum(m.value for snap in group for m in snap.plugins if m.name == metric.name)

    return tuple(attrs.evolve(metric, value=total(metric)) for metric in first.values())
