"""The ``ruvllm`` command line.

Every command is a small module under this package registering itself on :data:`main`;
plugins add their own through the ``ruvllm_register_commands`` hook. Errors print one clear
line and exit non-zero, never a traceback (``--verbose`` shows it).
"""

from __future__ import annotations

import ruvllm.cli.benchmark  # registers `ruvllm benchmark`
import ruvllm.cli.chat  # registers `ruvllm chat`
import ruvllm.cli.models  # registers download, list, info
import ruvllm.cli.serve  # noqa: F401  (registers `ruvllm serve`)
from ruvllm.cli import backends, conformance, generate, run_batch, tune  # noqa: F401  (registers commands)
from ruvllm.cli.app import main
from ruvllm.plugins import get_registry

get_registry().pm.hook.ruvllm_register_commands(cli=main)

__all__ = ["main"]
