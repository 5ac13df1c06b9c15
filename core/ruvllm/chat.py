"""Chat prompts rendered from the model's own Jinja template, the way transformers does it.

Hard-coding a chat format is how runtimes end up talking to a model in a dialect it was never
trained on; the template shipped with the model (GGUF ``tokenizer.chat_template`` or
``tokenizer_config.json``) is the only source of truth here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from ruvllm.errors import InvalidRequest

ROLES = ("system", "user", "assistant", "tool")

#: Used only when a model ships no template at all (a base model); ChatML is what the
#: embedded SmolLM2 and most small instruct models use, and the fallback is logged by callers.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(source)


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
        out.append(dict(m))
    return out


def render_chat(
    template: str | None,
    messages: Sequence[Mapping[str, Any]],
    *,
    bos_token: str = "",
    eos_token: str = "",
    add_generation_prompt: bool = True,
) -> str:
    """The prompt text for ``messages``; special tokens in it are parsed when tokenizing."""
    checked = validate_messages(messages)
    try:
        return _compile(template or CHATML).render(
            messages=checked,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
        )
    except jinja2.exceptions.TemplateError as exc:
        raise InvalidRequest("messages", f"the model's chat template rejected them: {exc}") from exc
