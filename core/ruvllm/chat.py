"""Chat prompts rendered from the model's own Jinja template, the way transformers does it.

Hard-coding a chat format is how runtimes end up talking to a model in a dialect it was never
trained on; the template shipped with the model (GGUF ``tokenizer.chat_template`` or
``tokenizer_config.json``) is the only source of truth here.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any

import attrs
import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ruvllm.errors import InvalidRequest
from ruvllm.tokenizer import require_encodable

log = logging.getLogger(__name__)

ROLES = ("system", "user", "assistant", "tool")

#: Used only when a model ships no template at all (a base model); ChatML is what the
#: embedded SmolLM2 and most small instruct models use. The fallback is logged once per process.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """Jinja's own ``tojson`` HTML-escapes ``<``, ``>``, ``&`` and quotes, which would put
    ``\u003c`` into prompts; templates written for transformers expect plain JSON."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    """The environment transformers renders chat templates in (``apply_chat_template``): real
    model templates use ``{% break %}``, ``strftime_now`` (Llama 3.1+) and ``raise_exception``."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


@lru_cache(maxsize=1)
def _log_chatml_fallback() -> None:
    log.warning("the model ships no chat template: chat prompts use ChatML, which may not be the "
                "format it was trained on (give the model a template to silence this)")


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    if not messages:
        raise InvalidRequest("messages", "must contain at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise InvalidRequest(f"messages[{i}]", f"must be an object with role and content; got {m!r}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise InvalidRequest(f"messages[{i}].role", f"must be one of {', '.join(ROLES)}; got {role!r}")
        if not isinstance(content, str):
            raise InvalidRequest(f"messages[{i}].content", f"must be a string; got {type(content).__name__}")
        require_encodable(f"messages[{i}].content", content)
        out.append(dict(m))
    return out


#: The variables render_chat gives every template, and where each comes from.
_TEMPLATE_VARIABLES = {
    "messages": "the request's messages", "tools": "the request's tools",
    "add_generation_prompt": "the request's add_generation_prompt", "bos_token": "the model's tokenizer",
    "eos_token": "the model's tokenizer", "raise_exception": "a template function",
    "strftime_now": "a template function",
}


@attrs.frozen
class TemplateOptions:
    """How a request wants its conversation rendered, beyond its messages and tools (vLLM's
    request fields, as ``apply_chat_template`` takes them).

    ``continue_final_message`` leaves the final message open for the model to continue (assistant
    prefill). With neither field set, a final assistant message with text is continued, as
    llama-server, Ollama, Anthropic's Messages API and transformers' text-generation pipeline do: a
    model trained on alternating turns answers a closed assistant turn with noise. Either field
    set gives vLLM's meaning: the final message is closed unless ``continue_final_message`` is
    true, and ``add_generation_prompt`` (vLLM's default true) opens a new answer after it.
    """

    add_generation_prompt: bool | None = None
    continue_final_message: bool | None = None
    #: More template variables (Qwen3's ``enable_thinking``); none may replace one set here.
    kwargs: Mapping[str, Any] | None = None

    def continues(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the prompt of ``messages`` ends inside their final message."""
        if self.continue_final_message is not None:
            return self.continue_final_message
        last = messages[-1]
        text = last.get("content")
        return (self.add_generation_prompt is None and last.get("role") == "assistant"
                and isinstance(text, str) and bool(text) and not last.get("tool_calls"))

    def generation_prompt(self, messages: Sequence[Mapping[str, Any]]) -> bool:
        """Whether the prompt ends with the header that opens a new assistant answer."""
        continues = self.continues(messages)
        if self.add_generation_prompt is None:
            return not continues
        if self.add_generation_prompt and continues:
            raise InvalidRequest("continue_final_message", "cannot be true together with "
                                 "add_generation_prompt: the prompt either continues the final message "
                                 "or opens a new answer; "
                                 "set add_generation_prompt to false (or leave it out)")
        return self.add_generation_prompt


#: The rendering a request gets when it asks nothing of its own.
DEFAULT_OPTIONS = TemplateOptions()


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    tools: Sequence[Mapping[str, Any]] | None = None,
    options: TemplateOptions = DEFAULT_OPTIONS,
) -> str:
    """The prompt text for ``messages``; special tokens in it are parsed when tokenizing.

    ``tools`` (OpenAI's tool dicts) reach the template as transformers passes them; a template
    that does not use them renders the same prompt as without. ``options.kwargs`` are further
    variables, as ``apply_chat_template(**kwargs)`` passes them (vLLM's ``chat_template_kwargs``);
    they cannot replace the variables set here."""
    checked = validate_messages(messages)
    extra = options.kwargs or {}
    clashes = sorted(extra.keys() & _TEMPLATE_VARIABLES.keys())
    if clashes:
        name = clashes[0]
        raise InvalidRequest(f"chat_template_kwargs.{name}",
                             f"is set by ruvllm ({_TEMPLATE_VARIABLES[name]}); remove it")
    generation_prompt = options.generation_prompt(checked)
    try:
        if template is None:
            _log_chatml_fallback()
        text = _compile(template or CHATML).render(
            **extra,
            messages=checked,
            add_generation_prompt=generation_prompt,
            tools=list(tools) if tools else None,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.exceptions.TemplateError as exc:
        raise InvalidRequest("messages", f"the model's chat template rejected them: {exc}") from exc
    return _open_final_message(text, checked) if options.continues(checked) else text


def _open_final_message(text: str, messages: Sequence[Mapping[str, Any]]) -> str:
    """``text`` cut right after the final message's content, dropping the end-of-turn tokens the
    template closed it with (transformers' ``continue_final_message``: a template may strip the
    content's surrounding whitespace, so its stripped form is searched, last occurrence)."""
    content = messages[-1].get("content")
    at = f"messages[{len(messages) - 1}].content"
    if not isinstance(content, str) or not content.strip():
        raise InvalidRequest(at, "must be text to continue (continue_final_message); give the final "
                             "message some text, or set continue_final_message to false")
    core = content.strip()
    where = text.rfind(core)
    if where < 0:
        raise InvalidRequest(at, "does not appear as written in the model's chat template, which changes "
                             "it, so it cannot be continued; set continue_final_message to false")
    kept = content.lstrip()
    end = where + len(kept) if text[where:where + len(kept)] == kept else where + len(core)
    return text[:end]
