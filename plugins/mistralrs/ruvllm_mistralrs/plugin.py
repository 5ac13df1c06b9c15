"""pluggy entry point (``ruvllm`` group): registers the mistral.rs backend.

Importing this module must stay cheap and must not import mistral.rs: the backend imports it
when it loads a model, and ``unavailable_reason`` reports a missing wheel instead of a crash.
"""

from __future__ import annotations

from collections.abc import Callable

import ruvllm

from ruvllm_mistralrs.backend import MistralRsBackend


@ruvllm.hookimpl
def ruvllm_register_backends(register: Callable[[type], None]) -> None:
    register(MistralRsBackend)
