"""ruvllm backend on llama.cpp, driven through llama-cpp-python's low-level C API.

Importing this package does not import ``llama_cpp``: a missing or broken build shows up as a
reason in ``ruvllm backends`` instead of an import crash that hides the plugin.
"""

from ruvllm_llamacpp.backend import LlamaCppBackend
from ruvllm_llamacpp.options import LlamaCppOptions

__all__ = ["LlamaCppBackend", "LlamaCppOptions"]
