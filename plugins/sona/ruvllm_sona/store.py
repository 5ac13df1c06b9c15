"""The instant loop's trajectory store: a bounded ring of finished requests and their feedback.

``record`` runs on the engine's model thread for every finished request, so it only stores
references (a dict insert and a deque append under a lock): no model work, no copies of the
token lists. Embeddings are filled in later by the background loop.
"""

from __future__ import annotations

import collections
import threading
import time

import attrs
import numpy as np
from ruvllm.feedback import check_score
from ruvllm.types import Trajectory


@attrs.define(eq=False)
class Record:
    trajectory: Trajectory
    finished: float
    feedback: float | None = None
    embedding: np.ndarray | None = None
    #: The background loop has trained on this record's feedback.
    trained: bool = False
    #: Used (at least once) for the EWC++ Fisher estimate.
    fisher_seen: bool = False


class TrajectoryStore:
    def __init__(self, capacity: int):
        self.capacity = capacity
        self._records: collections.OrderedDict[str, Record] = collections.OrderedDict()
        self._lock = threading.Lock()
        #: Feedbacks since the last deep consolidation.
        self.feedback_since_deep = 0

    def record(self, trajectory: Trajectory) -> None:
        rec = Record(trajectory, time.monotonic())
        with self._lock:
            self._records[trajectory.request_id] = rec
            if len(self._records) > self.capacity:
                self._records.popitem(last=False)

    def feedback(self, request_id: str, score: float) -> bool:
        """Attach ``score`` to a stored request; False when the id is unknown (or evicted)."""
        score = check_score(score)
        with self._lock:
            rec = self._records.get(request_id)
            if rec is None:
                return False
            rec.feedback = float(score)
            rec.trained = False  # a changed score is trained on again
            self.feedback_since_deep += 1
            return True

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._records

    def __len__(self) -> int:
        return len(self._records)

    def snapshot(self) -> list[Record]:
        with self._lock:
            return list(self._records.values())

    def pending_feedback(self) -> list[Record]:
        return [r for r in self.snapshot() if r.feedback is not None and not r.trained]

    def forget(self, tenant: str | None) -> None:
        """Drop ``tenant``'s requests (a tenant's reset)."""
        with self._lock:
            for rid in [rid for rid, r in self._records.items() if r.trajectory.tenant == tenant]:
                del self._records[rid]

    def clear(self) -> None:
        with self._lock:
            self._records.clear()
            self.feedback_since_deep = 0
