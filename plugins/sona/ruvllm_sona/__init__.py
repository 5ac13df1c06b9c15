"""SONA for ruvllm: the model learns from its users' feedback while it serves.

>>> from ruvllm.engine import ServingEngine
>>> import ruvllm_sona
>>> engine = ServingEngine(backend)                  # a candle_like backend
>>> sona = ruvllm_sona.attach(engine, ruvllm_sona.SonaOptions(interval=2.0))
>>> handle = engine.submit_sync(ids, params); result = handle.result()
>>> ruvllm.feedback(handle.request_id, 1.0)          # or POST /v1/feedback

See docs/sona.md.
"""

from ruvllm_sona.controller import Sona
from ruvllm_sona.options import SonaOptions
from ruvllm_sona.plugin import attach, detach, sona_for

__all__ = ["Sona", "SonaOptions", "attach", "detach", "sona_for"]
