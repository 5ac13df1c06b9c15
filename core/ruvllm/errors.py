"""One error hierarchy for every layer of ruvllm.

Each error says what was wrong and how to fix it, so that the CLI can print one line and the
server can map it to an HTTP status without guessing. The shape follows httpx: a single root,
a few families below it, and data on the exception rather than only in the message. Every error
class core and the bundled plugins raise is defined here, each with its ``http_status`` and
``error_type`` (tests/core/test_core_errors.py keeps it that way); other modules import them.
"""

from __future__ import annotations

from typing import Any


class RuvllmError(Exception):
    """Root of every error ruvllm raises on purpose."""

    #: HTTP status the OpenAI-compatible server answers with.
    http_status: int = 500
    #: OpenAI error ``type`` field.
    error_type: str = "internal_error"


class ConfigError(RuvllmError):
    """A configuration file, environment variable or flag is malformed."""

    http_status = 500
    error_type = "config_error"


class OptionError(ConfigError):
    """One option of a ruvllm.toml table (``[engine]``, ``[sona]``, ``[backends.<name>]``) is
    unknown or out of range.

    Carries the table, the option and the rejected value, so callers need not parse the
    message; the message names ``<table>.<option>``, what is wrong and what is accepted. Raised by
    :func:`ruvllm.options.parse_options` / :func:`ruvllm.options.parse_table` and their
    validators; :meth:`for_table` picks the subclass a table's errors have.
    """

    def __init__(self, table: str, option: str, reason: str, value: Any = None, *, fix: str | None = None):
        self.table = table
        self.option = option
        self.reason = reason
        self.value = value
        if fix is None:
            fix = f"set it in the [{table}] table of ruvllm.toml"
        super().__init__(f"{table}.{option}: {reason}; {fix}")

    @property
    def field(self) -> str:
        """The option's name, under the attribute name :class:`InvalidRequest` uses."""
        return self.option

    @staticmethod
    def for_table(table: str, option: str, reason: str, value: Any = None, *,
                  fix: str | None = None) -> OptionError:
        """The error for ``option`` of ``table``: :class:`BackendOptionError` for
        ``backends.<name>``, :class:`EngineOptionError` for ``engine``, else an OptionError."""
        if table.startswith("backends."):
            return BackendOptionError(table.removeprefix("backends."), option, reason, value, fix=fix)
        if table == EngineOptionError.TABLE:
            return EngineOptionError(option, reason, value, fix=fix)
        return OptionError(table, option, reason, value, fix=fix)


class BackendOptionError(OptionError):
    """One ``[backends.<backend>]`` option is unknown or out of range (``backend`` names it)."""

    def __init__(self, backend: str, option: str, reason: str, value: Any = None, *, fix: str | None = None):
        self.backend = backend
        if fix is None:
            fix = (f"set it in the [backends.{backend}] table of ruvllm.toml "
                   f"or with --option {option}=VALUE")
        super().__init__(f"backends.{backend}", option, reason, value, fix=fix)


class EngineOptionError(OptionError):
    """One ``[engine]`` option (:class:`ruvllm.engine.EngineOptions`) is unknown or out of range."""

    TABLE = "engine"

    def __init__(self, option: str, reason: str, value: Any = None, *, fix: str | None = None):
        super().__init__(self.TABLE, option, reason, value, fix=fix)


class BatchInvariantUnsupported(EngineOptionError):
    """``[engine] batch_invariant`` was asked of a backend, a configuration or a machine where a
    request's logits cannot be kept independent of what shares its batch (docs/engine.md,
    "Batch-invariant mode")."""

    def __init__(self, backend: str, reason: str):
        self.backend = backend
        super().__init__("batch_invariant", f"backend {backend!r} cannot hold it: {reason}", True,
                         fix="serve without batch_invariant, or on a backend that offers it "
                             "(candle_like, llamacpp)")


class PluginError(RuvllmError):
    """A plugin could not be found or loaded."""

    http_status = 500
    error_type = "plugin_error"


class UnknownBackend(PluginError):
    """No backend of that name is registered."""

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, name: str, known: list[str]):
        self.name = name
        self.known = sorted(known)
        listed = ", ".join(self.known) or "none"
        super().__init__(
            f"unknown backend {name!r}; installed backends: {listed}. "
            f"Install the plugin (pip install ruvllm-{name.replace('_', '-')}) or pick one "
            f"of the installed backends (see `ruvllm backends`)."
        )


class BackendUnavailable(PluginError):
    """The backend is installed but cannot run here (missing library, wrong platform...)."""

    http_status = 503
    error_type = "backend_unavailable"

    def __init__(self, name: str, reason: str):
        self.name = name
        self.reason = reason
        super().__init__(f"backend {name!r} is unavailable: {reason}")


class NativeProbeSkipped(PluginError):
    """A backend's native probe (:mod:`ruvllm.native_probe`) cannot run here, e.g. no model to
    probe with: no verdict on the native code, which is then neither trusted nor held back."""


class BatchFileError(RuvllmError):
    """A batch input file (OpenAI's batch format, ``ruvllm run-batch``) is malformed or cannot be
    read or written; names the lines and what a line must be."""

    http_status = 400
    error_type = "invalid_batch_file"
    #: Problems listed in the message before the rest are only counted.
    SHOWN_PROBLEMS = 10

    def __init__(self, message: str, problems: tuple[tuple[int, str], ...] = ()):
        #: Each malformed line's number (from 1) and what is wrong with it.
        self.problems = problems
        super().__init__(message)

    @classmethod
    def malformed(cls, problems: list[tuple[int, str]]) -> BatchFileError:
        shown = "; ".join(f"line {n} {why}" for n, why in problems[:cls.SHOWN_PROBLEMS])
        more = len(problems) - cls.SHOWN_PROBLEMS
        return cls(f"the batch input is malformed, nothing was run: {shown}"
                   + (f"; and {more} more" if more > 0 else ""), tuple(problems))


class ModelError(RuvllmError):
    """Family of errors about locating and loading model weights."""

    http_status = 500
    error_type = "model_error"


class ModelNotFound(ModelError):
    """The model reference resolves to nothing (unknown alias, missing file, not cached offline)."""

    http_status = 404
    error_type = "model_not_found"


class ModelStoreReadOnly(RuvllmError):
    """A request to change the server's set of models (Ollama's ``/api/delete``, ``/api/copy``,
    ``/api/create``, ``/api/push``): the models served are the configuration's, changed by editing
    it, so these are refused by name instead of answering a bare 404."""

    http_status = 501
    error_type = "not_implemented"

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        super().__init__(
            f"{endpoint} is not served: ruvllm serves the models its configuration names and changes no "
            "model store; edit [[models]] in ruvllm.toml (docs/configuration.md) and restart")


class ModelLoadError(ModelError):
    """The weights were found but the backend could not load them."""

    def __init__(self, model: str, reason: str):
        self.model = model
        self.reason = reason
        super().__init__(f"could not load model {model!r}: {reason}")


class DraftVocabularyMismatch(ModelLoadError):
    """A speculative-decoding draft model does not share the target model's vocabulary: its
    drafted token ids would mean other text to the target, so it is refused at start-up.
    ``target`` and ``draft`` name both models, ``difference`` says what differs."""

    def __init__(self, target: str, draft: str, difference: str):
        self.target = target
        self.draft = draft
        self.difference = difference
        super().__init__(draft, f"a draft model must share the target model's vocabulary, and {draft!r} "
                         f"does not share {target!r}'s: {difference}; pick a draft model of the same "
                         "family and tokenizer ([engine] speculative_model)")


class InvalidRequest(RuvllmError):
    """A request parameter is out of range or malformed; names the field and what is accepted."""

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, field: str, message: str, value: Any = None):
        self.field = field
        self.value = value
        super().__init__(f"{field}: {message}")


class GrammarEngineNotInstalled(InvalidRequest):
    """The selected grammar engine's library is missing (a request can name no other engine,
    so this is raised where the option is used, with how to install it)."""

    def __init__(self, engine: str, install_hint: str):
        self.engine = engine
        super().__init__("guided_decoding_backend",
                         f"the grammar engine {engine!r} is not installed; {install_hint}")


class UnsupportedByEngine(InvalidRequest):
    """The request's constraint is valid for another grammar engine but not the selected one:
    names the field, the engine that refused it and the engine that accepts it."""

    def __init__(self, field: str, engine: str, accepted_by: str, reason: str):
        self.engine = engine
        self.accepted_by = accepted_by
        super().__init__(field, f"{reason}; this server's grammar engine is {engine} "
                         f"(guided_decoding_backend), and {accepted_by} accepts it: serve with "
                         f"-e guided_decoding_backend={accepted_by}")


class GrammarCompileTimeout(InvalidRequest):
    """A request's grammar did not compile within the time limit. The compile ran in a child
    process that was killed at the limit, so nothing of it keeps running; the fix is a simpler
    grammar (or a larger limit for a trusted client)."""

    def __init__(self, field: str, kind: str, engine: str, timeout: float):
        self.engine = engine
        self.timeout = timeout
        super().__init__(field, f"the {kind} grammar did not compile within {timeout:g} s ({engine}); "
                         "simplify it")


class GrammarCompileCrashed(InvalidRequest):
    """The grammar compiler died (a signal, out of memory) while compiling a request's grammar in
    its child process; the server itself is unaffected and the grammar is refused."""

    def __init__(self, field: str, kind: str, engine: str, exitcode: int | None):
        self.engine = engine
        super().__init__(field, f"the {kind} grammar made the compiler ({engine}) exit with code "
                         f"{exitcode}; simplify it")


class ContextLengthExceeded(InvalidRequest):
    """Prompt plus requested tokens do not fit in the model's context window."""

    def __init__(self, prompt_tokens: int, max_tokens: int, context_length: int, *, limit_note: str = ""):
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length
        # Where the engine allows less than the model's window (a KV budget), the note says why
        # and how to raise it: "the model's context length" alone would be wrong there.
        limit = f"one request may use {context_length} tokens ({limit_note})" if limit_note \
            else f"the model's context length is {context_length}"
        room = context_length - prompt_tokens
        # No max_tokens fits a prompt that fills the window alone: only shortening it helps.
        fix = (f"shorten the prompt or lower max_tokens to at most {room}" if room > 0 else
               f"shorten the prompt by at least {1 - room} tokens, leaving room for one new token")
        super().__init__(
            "prompt",
            f"the prompt has {prompt_tokens} tokens and {max_tokens} more were requested, "
            f"but {limit}; {fix}",
            value=prompt_tokens,
        )


class FeedbackNotFound(RuvllmError):
    """Feedback names a request no learning plugin holds (never served, evicted, or no learning
    plugin attached to the engine); see :mod:`ruvllm.feedback`."""

    http_status = 404
    error_type = "not_found_error"


class StoredObjectNotFound(RuvllmError):
    """A file or batch id (OpenAI's Files and Batch APIs) this server does not hold: never made,
    deleted, expired, or made before the server restarted (it keeps them in memory)."""

    http_status = 404
    error_type = "not_found_error"

    def __init__(self, kind: str, object_id: str, hint: str):
        self.kind = kind
        self.object_id = object_id
        super().__init__(f"no {kind} {object_id!r} on this server (deleted, expired, or made before it "
                         f"restarted); {hint}")


class Cancelled(RuvllmError):
    """The request was cancelled by its caller before it finished."""

    http_status = 499
    error_type = "cancelled"


class RequestTimedOut(Cancelled):
    """The request passed its deadline; ``partial`` holds the GenerationResult of what it had
    generated (the engine fills it in when it ends the request)."""

    http_status = 504
    error_type = "timeout"

    def __init__(self, request_id: str, timeout: float, partial: Any = None):
        self.request_id = request_id
        self.timeout = timeout
        self.partial = partial
        super().__init__(
            f"request {request_id} did not finish within its {timeout:g} s timeout; raise the "
            "timeout (submit(timeout=...) or [engine] request_timeout) or lower max_tokens"
        )


class Overloaded(RuvllmError):
    """The engine's queue is full; retry later."""

    http_status = 503
    error_type = "overloaded"

    def __init__(self, message: str, retry_after: float = 1.0):
        self.retry_after = retry_after
        super().__init__(message)


class EngineClosed(RuvllmError):
    """The engine was shut down; create a new one."""

    http_status = 503
    error_type = "engine_closed"


class BackendError(RuvllmError):
    """The engine underneath failed while serving a request."""

    http_status = 500
    error_type = "backend_error"


class NamespacesUnavailable(RuvllmError):
    """A cluster of network namespaces (:mod:`ruvllm.scaleout.netns`) cannot be made here: not
    root, a capability or a tool missing. ``reason`` names what, for the skip message."""

    def __init__(self, reason: str):
        self.reason = reason
        super().__init__(f"cannot make network namespaces here: {reason}")


class ClusterStartError(RuvllmError):
    """A host of a namespace cluster (:mod:`ruvllm.scaleout.netns`) did not come up; the
    message carries the command's output."""
