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
    "add_generation_prompt": "always true for a new answer", "bos_token": "the model's tokenizer",
    "eos_token": "the model's tokenizer", "raise_exception": "a template function",
    "strftime_now": "a template function",
}


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
    tools: Sequence[Mapping[str, Any]] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """The prompt text for ``messages``; special tokens in it are parsed when tokenizing.

    ``tools`` (OpenAI's tool dicts) reach the template as transformers passes them; a template
    that does not use them renders the same prompt as without. ``template_kwargs`` are further
    variables, as ``apply_chat_template(**kwargs)`` passes them (vLLM's ``chat_template_kwargs``:
    Qwen3's ``enable_thinking``); they cannot replace the variables set here."""
    checked = validate_messages(messages)
    extra = template_kwargs or {}
    clashes = sorted(extra.keys() & _TEMPLATE_VARIABLES.keys())
    if clashes:
        name = clashes[0]
        raise InvalidRequest(f"chat_template_kwargs.{name}",
                             f"is set by ruvllm ({_TEMPLATE_VARIABLES[name]}); remove it")
    try:
        if template is None:
            _log_chatml_fallback()
        return _compile(template or CHATML).render(
            **extra,
            messages=checked,
            add_generation_prompt=add_generation_prompt,
            tools=list(tools) if tools else None,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.exceptions.TemplateError as exc:
        raise InvalidRequest("messages", f"the model's chat template rejected them: {exc}") from exc
