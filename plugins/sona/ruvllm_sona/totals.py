"""What SONA has done on one engine, counted for ``/metrics``.

The engine's metrics promise counters that never go back (``ruvllm.serving.PluginMetric``), so
the totals belong to the engine, not to one :class:`~ruvllm_sona.controller.Sona`: attaching SONA
again (new options, or after ``detach``) carries them on. No torch here: the plugin's entry
module keeps them per engine without importing the learning code.
"""

from __future__ import annotations

import threading

import attrs


@attrs.define
class SonaTotals:
    #: Scores received for requests SONA recorded.
    feedback: int = 0
    #: Background-loop updates (one per tenant with new scores) and the seconds they took.
    updates: int = 0
    update_seconds: float = 0.0
    #: Deep-loop consolidations.
    consolidations: int = 0
    _lock: threading.Lock = attrs.field(factory=threading.Lock, repr=False, eq=False)

    def add(self, *, feedback: int = 0, updates: int = 0, update_seconds: float = 0.0,
            consolidations: int = 0) -> None:
        """Count (from any thread: feedback arrives on the server's, updates on SONA's)."""
        with self._lock:
            self.feedback += feedback
            self.updates += updates
            self.update_seconds += update_seconds
            self.consolidations += consolidations
