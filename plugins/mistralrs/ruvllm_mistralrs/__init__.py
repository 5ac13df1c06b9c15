"""ruvllm backend on mistral.rs (the ``mistralrs`` PyPI package and its accelerator builds)."""

from ruvllm_mistralrs.backend import AdapterInfo, MistralRsBackend

__all__ = ["AdapterInfo", "MistralRsBackend"]
