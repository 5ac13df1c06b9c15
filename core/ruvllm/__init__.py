"""ruvllm: one LLM serving runtime, many engines."""

from ruvllm.backend import LlmBackend, sample_stream
from ruvllm.errors import (
    BackendUnavailable,
    Cancelled,
    ContextLengthExceeded,
    InvalidRequest,
    ModelLoadError,
    ModelNotFound,
    Overloaded,
    RuvllmError,
    UnknownBackend,
)
from ruvllm.hookspecs import hookimpl
from ruvllm.llm import LLM
from ruvllm.models import ModelSource
from ruvllm.types import (
    Capabilities,
    FinishReason,
    GenerationParams,
    GenerationResult,
    ModelInfo,
    SampledToken,
    SpecialTokens,
    TokenOutput,
)

__version__ = "0.1.0"

__all__ = [
    "LLM",
    "BackendUnavailable",
    "Cancelled",
    "Capabilities",
    "ContextLengthExceeded",
    "FinishReason",
    "GenerationParams",
    "GenerationResult",
    "InvalidRequest",
    "LlmBackend",
    "ModelInfo",
    "ModelLoadError",
    "ModelNotFound",
    "ModelSource",
    "Overloaded",
    "RuvllmError",
    "SampledToken",
    "SpecialTokens",
    "TokenOutput",
    "UnknownBackend",
    "hookimpl",
    "sample_stream",
]
