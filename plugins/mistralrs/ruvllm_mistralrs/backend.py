"""The mistral.rs backend: request-level generation through mistral.rs's own scheduler.

mistral.rs owns its forward pass, KV cache and sampler, so this is a request-level backend
(``executor=False``, ``core_sampler=False``): each ``generate`` call becomes one streaming
mistral.rs request, and several calls in flight are batched by mistral.rs (``max_seqs``).
"""

from __future__ import annotations

import importlib.util
import logging
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from ruvllm.backend import LlmBackend
from ruvllm.errors import BackendError, BackendUnavailable, InvalidRequest, ModelLoadError, RuvllmError
from ruvllm.models import ModelSource
from ruvllm.options import parse_options
from ruvllm.tokenizer import Tokenizer
from ruvllm.types import Capabilities, GenerationParams, ModelInfo, SampledToken

from ruvllm_mistralrs.engine import (
    PASS_THROUGH_TEMPLATE,
    check_paged_attention,
    runner_kwargs,
    serial_prefill,
    which_for,
)
from ruvllm_mistralrs.memory import release_freed_heap
from ruvllm_mistralrs.model_files import read_model_files
from ruvllm_mistralrs.options import MistralRsOptions
from ruvllm_mistralrs.platform import Build, installed_build
from ruvllm_mistralrs.requantize import resolve_isq
from ruvllm_mistralrs.requests import SEED_UNSUPPORTED, chat_request
from ruvllm_mistralrs.runtime import (
    PAGED_UNAVAILABLE,
    RuntimePlacement,
    captured_stdout,
    placement_notes,
    placement_of_load,
)
from ruvllm_mistralrs.threads import configure_threads
from ruvllm_mistralrs.token_ids import TokenIdResolver
from ruvllm_mistralrs.worker import RunnerThread
from ruvllm_mistralrs.xlora import KNOWN_BROKEN as XLORA_KNOWN_BROKEN
from ruvllm_mistralrs.xlora import probe, stage_xlora, xlora_unavailable_reason

log = logging.getLogger(__name__)


@attrs.frozen(kw_only=True)
class AdapterInfo:
    alias: str
    path: str
    rank: int
    bytes: int
    #: mistral.rs's id of this exact adapter version (changes when the alias is reloaded).
    generation: str


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"


class MistralRsBackend(LlmBackend):
    name = "mistralrs"
    formats = ("gguf", "hf")

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Checked without importing mistral.rs (``backend = "auto"`` asks every candidate before
        the chosen one): a module that is installed but does not import fails :meth:`load`."""
        if installed_build() is None or importlib.util.find_spec("mistralrs") is None:
            return ("mistral.rs is not installed: pip install mistralrs (or mistralrs-cuda, "
                    "mistralrs-metal, mistralrs-mkl)")
        return None

    @classmethod
    def version(cls) -> str | None:
        build = installed_build()
        return build.version if build else None

    @classmethod
    def capabilities(cls) -> Capabilities:
        """Capabilities before a model is loaded: what the installed build allows. A loaded
        backend reports the device mistral.rs actually placed the model on, and PagedAttention
        only when mistral.rs configured it (see ruvllm_mistralrs.runtime)."""
        build = installed_build()
        notes = []
        if build is not None and build.paged_kernels:
            notes.append(f"device, paged_attention: decided when a model loads: {build.distribution} targets "
                         f"{build.device}, but mistral.rs falls back to the CPU without a usable "
                         f"{build.device} device, and uses PagedAttention only on a GPU placement")
        return cls._capabilities(build, device=build.device if build else "cpu", paged=False, extra=notes)

    @classmethod
    def _capabilities(cls, build: Build | None, *, device: str, paged: bool,
                      extra: Sequence[str]) -> Capabilities:
        notes = [
            "sampling runs inside mistral.rs: a per-request seed cannot be honoured (its RNG is seeded "
            "once per engine with the option seed)",
            "no iteration-level executor: mistral.rs schedules and batches the requests in flight "
            "itself (option max_seqs)",
            *extra,
        ]
        if build is not None and not build.paged_kernels and not any(n.startswith("paged_attention:")
                                                                      for n in extra):
            notes.append(f"paged_attention: {build.paged_attention_absent_reason}")
        if build is not None and build.version in XLORA_KNOWN_BROKEN:
            notes.append(f"xlora: mistral.rs {build.version} loads X-LoRA models but fails the prompt step "
                         f"of any prompt longer than one token ({XLORA_KNOWN_BROKEN[build.version]!r}, "
                         "measured); loading with option xlora checks this and raises BackendUnavailable")
        return Capabilities(
            streaming=True, executor=False, logprobs=True, core_sampler=False,
            concurrent_requests=True, lora=True, isq=True, paged_attention=paged,
            embeddings=False, device=device, notes=tuple(notes),
        )

    @classmethod
    def load(cls, model: ModelSource, options: Mapping[str, Any]) -> MistralRsBackend:
        opts = parse_options(MistralRsOptions, cls.name, options)
        build = installed_build()
        if build is None:
            raise BackendUnavailable(cls.name, cls.unavailable_reason() or "not installed")
        check_paged_attention(opts, build)
        try:
            import mistralrs  # noqa: F401
        except ImportError as exc:
            raise BackendUnavailable(cls.name, f"the mistralrs module does not import: {exc}") from exc
        return cls(model, opts, build)

    def __init__(self, model: ModelSource, opts: MistralRsOptions, build: Build):
        import mistralrs

        self._m = mistralrs
        self.options = opts
        self.build = build
        files = read_model_files(model, opts.tokenizer_json)
        self._tok = files.tokenizer
        self._tmp = tempfile.TemporaryDirectory(prefix="ruvllm-mistralrs-")
        template = Path(self._tmp.name) / "pass_through.jinja"
        template.write_text(PASS_THROUGH_TEMPLATE, encoding="utf-8")
        staged = None
        if opts.xlora is not None and model.format == "hf":
            try:
                staged = stage_xlora(opts.xlora, Path(model.path), Path(self._tmp.name) / "xlora")
            except RuvllmError:
                self._tmp.cleanup()
                raise
        isq = resolve_isq(opts.isq, model, files.quantization, build)
        if isq.reason:
            log.info("mistralrs: %s", isq.reason)
        which = which_for(mistralrs, model, opts, staged)
        kwargs = runner_kwargs(mistralrs, opts, build, template, isq=isq.isq)

        threads = configure_threads(opts.threads)

        placements: list[RuntimePlacement | None] = []

        def create() -> Any:
            # mistral.rs refuses the load if its estimate exceeds the available memory it reads
            # now; without this, heap freed by models closed earlier in the process counts as used.
            release_freed_heap()
            try:
                # Its load log is the only place mistral.rs says where it put the model.
                with captured_stdout() as load_log:
                    runner = mistralrs.Runner(which=which, **kwargs)
            except Exception as exc:  # mistral.rs reports load failures as ValueError/RuntimeError
                if PAGED_UNAVAILABLE in str(exc):
                    raise BackendUnavailable(
                        self.name, f"PagedAttention was asked for (options paged_*), and mistral.rs says: "
                        f"{_first_line(exc)}; it runs only on a model placed on a CUDA or Metal device",
                    ) from exc
                raise ModelLoadError(model.name, f"mistral.rs could not load it: {_first_line(exc)}") from exc
            placements.append(placement_of_load(load_log.text))
            return runner

        self._runner = RunnerThread(create)
        #: Where mistral.rs placed the model (None: its load log did not say).
        self.placement = placements[0]
        device = self.placement.device if self.placement else build.device
        # Instance view of the capabilities: the device and PagedAttention of this load.
        self.capabilities = lambda: type(self)._capabilities(  # type: ignore[method-assign]
            build, device=device, paged=bool(self.placement and self.placement.paged_attention),
            extra=[*placement_notes(self.placement, build.device),
                   f"{threads[0]} CPU compute threads ({threads[1]})", *filter(None, [isq.reason])])
        if staged is not None:
            failure = self._runner.call(lambda r: probe(r, mistralrs))
            if failure is not None:
                self.close()
                raise BackendUnavailable(self.name, xlora_unavailable_reason(build, failure))
        engine_ctx = self._runner.call(lambda r: r.max_sequence_length()) or files.context_length
        self._info = files.info(model, context_length=min(engine_ctx, files.context_length),
                                quantization=isq.isq)
        self._resolver = TokenIdResolver(self._tok.token_bytes())
        self.serial_prefill = serial_prefill(opts, model, isq=isq.isq)
        self._adapters: dict[str, AdapterInfo] = {}
        self._revisions: dict[str, int] = {}
        self._revision_clock = 0
        try:
            for alias, path in opts.adapters.items():
                self.load_adapter(alias, path)
        except RuvllmError:
            self.close()
            raise
        self.default_adapter = opts.adapter

    # -- LlmBackend ---------------------------------------------------------------------------
    @property
    def tokenizer(self) -> Tokenizer:
        return self._tok

    @property
    def info(self) -> ModelInfo:
        return self._info

    def cached_tokens(self) -> int | None:
        # Without the prefix cache mistral.rs frees a sequence's KV when it ends; with it, it
        # keeps up to prefix_cache_size sequences whose size the binding does not report.
        return 0 if self.options.prefix_cache_size == 0 else None

    def generate(self, prompt_ids: Sequence[int], params: GenerationParams, *,
                 adapter: str | None = None) -> Iterator[SampledToken]:
        """Stream the tokens mistral.rs samples with the LoRA adapter this request names: the
        ``adapter`` argument, else ``params.adapter`` (how the engine and the server pass a
        request's choice), else :attr:`default_adapter`; None runs the base model.

        The request is checked and handed to mistral.rs *now*, not at the first ``next()``: the
        engine's request path starts every admitted request before it reads any of them, so
        mistral.rs sees them all at once and can batch their prompts (where prefill is not serial)
        instead of receiving each only after the previous one produced a token."""
        chosen = next((a for a in (adapter, getattr(params, "adapter", None), self.default_adapter)
                       if a is not None), None)
        if chosen is not None:
            self._check_loaded(chosen)
        hidden = sorted(self._hidden_specials(params))
        context = list(prompt_ids)
        submitted = self._start(context, params, params.max_tokens, chosen, hidden)
        return self._stream(context, params, chosen, hidden, submitted)

    def _start(self, context: list[int], params: GenerationParams, remaining: int, adapter: str | None,
               hidden: list[int]) -> tuple[Any, Any]:
        """Submit one mistral.rs request for ``context``: (stream, first chunk or None)."""
        # mistral.rs always stops on EOS (it streams no chunk for it); under ignore_eos the
        # backend hands core the EOS and continues with a new request on prompt + output.
        segment = attrs.evolve(params, max_tokens=remaining, ignore_eos=False)
        text = self._tok.decode(context, skip_special=False)
        request = chat_request(self._m, text, segment, adapter=adapter, banned=hidden)
        return self._submit(context, text, request)

    def _stream(self, context: list[int], params: GenerationParams, adapter: str | None, hidden: list[int],
                submitted: tuple[Any, Any]) -> Iterator[SampledToken]:
        remaining = params.max_tokens
        while True:
            ended_on_eos = False
            for token in self._segment(submitted, params):
                context.append(token.token_id)
                remaining -= 1
                ended_on_eos = token.token_id in self._tok.eos_ids
                yield token
            if remaining <= 0 or not (ended_on_eos and params.ignore_eos):
                return
            submitted = self._start(context, params, remaining, adapter, hidden)

    def _segment(self, submitted: tuple[Any, Any], params: GenerationParams) -> Iterator[SampledToken]:
        """One mistral.rs request: its streamed tokens, then EOS if it stopped on EOS."""
        stream, first = submitted
        del submitted
        produced = 0
        try:
            for chunk in self._chunks(first, stream):
                choice = chunk.choices[0] if chunk.choices else None
                if choice is None:
                    continue
                if choice.logprobs is not None:
                    produced += 1
                    yield self._token_of(choice.logprobs, params)
                if choice.finish_reason is None:
                    continue
                if choice.finish_reason == "stop" and self._tok.eos_ids:
                    # mistral.rs stopped on EOS and sent no chunk for it: hand core the EOS id.
                    produced += 1
                    yield SampledToken(token_id=self._tok.eos_ids[0])
                usage = getattr(chunk, "usage", None)
                if usage is not None and usage.completion_tokens != produced:
                    raise BackendError(
                        f"mistral.rs generated {usage.completion_tokens} tokens but streamed {produced}; "
                        f"a token without a stream chunk (a special token) was sampled")
                return
        except RuvllmError:
            raise
        except Exception as exc:
            raise BackendError(f"mistral.rs failed while generating: {_first_line(exc)}") from exc
        finally:
            # Dropping the stream drops mistral.rs's response channel; the engine then ends the
            # sequence and frees its KV (the tests check it through the adapter lease count).
            del stream, first

    @staticmethod
    def _chunks(first: Any, stream: Any) -> Iterator[Any]:
        if first is not None:
            yield first
        yield from stream

    def _hidden_specials(self, params: GenerationParams) -> set[int]:
        """Special tokens to ban: mistral.rs streams nothing for them, so core could not see them.
        EOS stays allowed: mistral.rs stops on it and the backend reports it."""
        hidden = set(self._tok.special_ids) - set(self._tok.eos_ids)
        stop_specials = sorted(set(params.stop_token_ids) & hidden)
        if stop_specials:
            raise InvalidRequest(
                "stop_token_ids", f"{stop_specials} are special tokens, which mistral.rs does not stream; "
                "only EOS and ordinary tokens can end a request here", stop_specials)
        return hidden

    def _submit(self, ids: list[int], text: str, request: Any) -> tuple[Any, Any]:
        serial = self.serial_prefill
        # mistral.rs takes the prompt as text and tokenizes it with the same tokenizer core uses
        # (tests/mistralrs check they agree), so the ids it will run are checked here. Not with
        # Runner.tokenize_text: that waits for the engine's current step (0.2-0.8 s measured with
        # requests in flight), which serialised the admission of concurrent requests.
        seen = self._tok.encode(text, add_special=False, parse_special=True)
        if seen != ids:
            raise InvalidRequest(
                "prompt", "mistral.rs takes prompts as text, and these token ids do not survive "
                f"decode+encode ({len(ids)} ids became {len(seen)}); send text or the ids the "
                "model's tokenizer produces for it", None,
            )

        def submit(runner: Any) -> tuple[Any, Any]:
            stream = runner.send_chat_completion_request(request)
            # Serial prefill: wait here, on the Runner thread, until this prompt's first token
            # exists, so mistral.rs never prefills two prompts in one step.
            first = next(stream, None) if serial else None
            return stream, first

        try:
            return self._runner.call(submit)
        except RuvllmError:
            raise
        except Exception as exc:
            raise BackendError(f"mistral.rs rejected the request: {_first_line(exc)}") from exc

    def _token_of(self, lp: Any, params: GenerationParams) -> SampledToken:
        top = tuple((int(t.token), float(t.logprob)) for t in (lp.top_logprobs or ()))
        token_id = self._resolver.resolve(bytes(lp.bytes or b""), float(lp.logprob), top)
        if params.logprobs is None:
            return SampledToken(token_id=token_id)
        return SampledToken(token_id=token_id, logprob=float(lp.logprob), top_logprobs=top[: params.logprobs])

    def close(self) -> None:
        runner = getattr(self, "_runner", None)
        if runner is not None:
            runner.close()
        tmp = getattr(self, "_tmp", None)
        if tmp is not None:
            tmp.cleanup()

    # -- LoRA adapters (ruvllm.adapters.AdapterHost) ------------------------------------------
    @property
    def adapters(self) -> dict[str, AdapterInfo]:
        return dict(self._adapters)

    def adapter_names(self) -> tuple[str, ...]:
        return tuple(self._adapters)

    def adapter_revision(self, name: str) -> int:
        """Grows with every load, replacement and unload of ``name``: core keys prefix-cache
        entries on it, so KV computed with an older version is never reused."""
        self._check_loaded(name)
        return self._revisions[name]

    def _check_loaded(self, name: str) -> None:
        if name in self._adapters:
            return
        if not self.options.wants_lora:
            raise InvalidRequest("adapter", f"{name!r}: this backend was loaded without the LoRA runtime; "
                                 "load it with lora=true or adapters={...} to use adapters", name)
        raise InvalidRequest("adapter", f"{name!r} is not loaded; loaded adapters: "
                             f"{', '.join(self._adapters) or 'none'} (see load_adapter)", name)

    def _bump_revision(self, name: str) -> None:
        self._revision_clock += 1
        self._revisions[name] = self._revision_clock

    def load_adapter(self, alias: str, path: str | Path) -> AdapterInfo:
        """Load (or replace) the PEFT LoRA adapter ``alias`` while the engine runs.

        Requests already running keep the adapter version they started with."""
        if not self.options.wants_lora:
            raise InvalidRequest("adapters", "the dynamic LoRA runtime is off; load the backend with "
                                 "lora=true (or adapters={...}) to hot-load adapters", alias)
        folder = Path(path).expanduser()
        if not (folder / "adapter_config.json").is_file():
            raise InvalidRequest("adapters", f"{folder} has no adapter_config.json (a PEFT LoRA "
                                 "directory needs adapter_config.json and adapter_model.safetensors)",
                                 str(folder))
        replace = alias in self._adapters

        def load(runner: Any) -> Any:
            return runner.load_lora_adapter(alias, str(folder), load_inplace=replace)

        info = self._adapter_call(load, alias)
        self._adapters[alias] = AdapterInfo(alias=alias, path=str(folder), rank=info.rank,
                                            bytes=info.bytes, generation=info.generation)
        self._bump_revision(alias)
        return self._adapters[alias]

    def unload_adapter(self, alias: str) -> None:
        """Unload ``alias``; requests still running with it finish with it."""
        if alias not in self._adapters:
            raise InvalidRequest("adapter", f"{alias!r} is not loaded", alias)
        self._adapter_call(lambda r: r.unload_lora_adapter(alias), alias)
        del self._adapters[alias]
        self._bump_revision(alias)
        if self.default_adapter == alias:
            self.default_adapter = None

    def adapter_leases(self) -> int:
        """Requests currently holding an adapter (mistral.rs's lease count)."""
        if not self.options.wants_lora:
            return 0
        status = self._adapter_call(lambda r: r.lora_adapter_status(), "")
        return sum(g.active_leases for g in status.generations)

    def _adapter_call(self, fn: Any, alias: str) -> Any:
        try:
            return self._runner.call(fn)
        except RuvllmError:
            raise
        except Exception as exc:
            code = getattr(exc, "code", None)
            raise InvalidRequest("adapter", f"mistral.rs refused adapter {alias!r}"
                                 f"{f' ({code})' if code else ''}: {_first_line(exc)}", alias) from exc


__all__ = ["SEED_UNSUPPORTED", "AdapterInfo", "MistralRsBackend"]
