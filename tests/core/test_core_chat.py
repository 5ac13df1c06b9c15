"""Chat prompts rendered from the model's own Jinja template, and typed errors for bad messages."""

from __future__ import annotations

import pytest
from ruvllm.chat import CHATML, TemplateOptions, render_chat, validate_messages
from ruvllm.errors import InvalidRequest

#: SmolLM2-135M-Instruct's template, as stored in the embedded GGUF (tokenizer.chat_template).
SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)

#: A Mistral/Llama-2 style template: BOS/EOS text and raise_exception on bad role order.
INST_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token }}{% endif %}"
    "{% endfor %}"
)


def test_smollm2_template_adds_its_default_system_prompt():
    out = render_chat(SMOLLM2_TEMPLATE, [{"role": "user", "content": "Hi!"}])
    assert out == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
        "<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )


def test_smollm2_template_with_a_system_message_and_no_generation_prompt():
    msgs = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4"},
    ]
    out = render_chat(SMOLLM2_TEMPLATE, msgs, options=TemplateOptions(add_generation_prompt=False))
    assert out == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n"
    )


PREFILL = [{"role": "user", "content": "List three colours."},
           {"role": "assistant", "content": "1. Red\n2."}]
CLOSED = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
          "<|im_end|>\n<|im_start|>user\nList three colours.<|im_end|>\n"
          "<|im_start|>assistant\n1. Red\n2.<|im_end|>\n")
NEW_ANSWER = CLOSED + "<|im_start|>assistant\n"


def _prefill(**options) -> str:
    return render_chat(SMOLLM2_TEMPLATE, PREFILL, options=TemplateOptions(**options))


def test_a_final_assistant_message_is_continued_unless_the_request_says_otherwise():
    """llama-server's, Ollama's and Anthropic's prefill when nothing is asked; vLLM's fields, once
    either is set, mean what they mean there."""
    continued = CLOSED.removesuffix("<|im_end|>\n")
    assert _prefill() == _prefill(continue_final_message=True) == continued
    assert _prefill(continue_final_message=False) == _prefill(add_generation_prompt=True) == NEW_ANSWER
    assert _prefill(add_generation_prompt=False) == CLOSED


def test_continuing_keeps_the_final_messages_own_spacing_and_takes_its_last_occurrence():
    messages = [{"role": "user", "content": "Say 1. Red"}, {"role": "assistant", "content": "1. Red "}]
    out = render_chat(CHATML, messages)
    assert out == "<|im_start|>user\nSay 1. Red<|im_end|>\n<|im_start|>assistant\n1. Red "
    stripping = CHATML.replace("message['content']", "message['content'] | trim")
    assert render_chat(stripping, messages).endswith("<|im_start|>assistant\n1. Red")


@pytest.mark.parametrize("options, final, field", [
    (TemplateOptions(add_generation_prompt=True, continue_final_message=True), PREFILL[-1],
     "continue_final_message"),
    (TemplateOptions(continue_final_message=True), {"role": "assistant", "content": " "},
     "messages[1].content"),
])
def test_a_continuation_that_cannot_be_rendered_names_the_field(options, final, field):
    with pytest.raises(InvalidRequest) as err:
        render_chat(SMOLLM2_TEMPLATE, [PREFILL[0], final], options=options)
    assert err.value.field == field


def test_a_template_that_rewrites_the_final_message_cannot_continue_it():
    upper = CHATML.replace("message['content']", "message['content'] | upper")
    with pytest.raises(InvalidRequest, match="changes it") as err:
        render_chat(upper, PREFILL)
    assert err.value.field == "messages[1].content"
    assert render_chat(upper, PREFILL, options=TemplateOptions(continue_final_message=False)).endswith(
        "1. RED\n2.<|im_end|>\n<|im_start|>assistant\n")


def test_a_final_assistant_turn_of_tool_calls_is_not_continued():
    calls = [{"type": "function", "function": {"name": "f", "arguments": {}}}]
    messages = [PREFILL[0], {"role": "assistant", "content": "", "tool_calls": calls}]
    assert render_chat(CHATML, messages).endswith("<|im_end|>\n<|im_start|>assistant\n")


def gguf_metadata_string(path, wanted: str) -> str | None:
    """One string value from a GGUF file's key/value header (a small reader: the gguf package's
    full reader also maps every tensor and takes seconds)."""
    import struct

    scalar = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}

    with open(path, "rb") as fh:
        def read(fmt):
            return struct.unpack("<" + fmt, fh.read(struct.calcsize("<" + fmt)))[0]

        def string():
            return fh.read(read("Q"))

        def skip(vtype):
            if vtype == 8:
                string()
            elif vtype == 9:
                item, count = read("I"), read("Q")
                if item in scalar:
                    fh.seek(scalar[item] * count, 1)
                else:
                    for _ in range(count):
                        skip(item)
            else:
                fh.seek(scalar[vtype], 1)

        assert fh.read(4) == b"GGUF"
        read("I")  # version
        read("Q")  # tensor count
        for _ in range(read("Q")):
            key, vtype = string().decode(), read("I")
            if key == wanted and vtype == 8:
                return string().decode()
            skip(vtype)
    return None


def test_the_literal_matches_the_embedded_gguf():
    from ruvllm.registry import embedded_model_path

    assert gguf_metadata_string(embedded_model_path(), "tokenizer.chat_template") == SMOLLM2_TEMPLATE


def test_bos_and_eos_tokens_reach_the_template():
    msgs = [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
    ]
    out = render_chat(INST_TEMPLATE, msgs, bos_token="<s>", eos_token="</s>")
    assert out == "<s>[INST] a [/INST]b</s>[INST] c [/INST]"


def test_raise_exception_in_the_template_is_an_invalid_request():
    msgs = [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    with pytest.raises(InvalidRequest) as info:
        render_chat(INST_TEMPLATE, msgs, bos_token="<s>")
    assert info.value.field == "messages"
    assert "roles must alternate" in str(info.value)


@pytest.mark.parametrize("role", ["admin", None, "USER", 3])
def test_invalid_role_names_the_message(role):
    msgs = [{"role": "user", "content": "ok"}, {"role": role, "content": "x"}]
    with pytest.raises(InvalidRequest) as info:
        render_chat(SMOLLM2_TEMPLATE, msgs)
    assert info.value.field == "messages[1].role"
    assert "system, user, assistant, tool" in str(info.value)


def test_non_string_content_names_the_message():
    with pytest.raises(InvalidRequest) as info:
        validate_messages([{"role": "user", "content": ["parts"]}])
    assert info.value.field == "messages[0].content"


def test_message_that_is_not_an_object():
    with pytest.raises(InvalidRequest) as info:
        validate_messages([{"role": "user", "content": "a"}, "just text"])
    assert info.value.field == "messages[1]"


def test_no_messages():
    with pytest.raises(InvalidRequest) as info:
        render_chat(None, [])
    assert info.value.field == "messages"


def test_no_template_falls_back_to_chatml():
    assert render_chat(None, [{"role": "user", "content": "x"}]) == render_chat(
        CHATML, [{"role": "user", "content": "x"}]
    ) == "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"


def test_broken_template_is_an_invalid_request_not_a_crash():
    with pytest.raises(InvalidRequest):
        render_chat("{% for m in messages %}{{ m['content'] }", [{"role": "user", "content": "x"}])


def test_template_cannot_mutate_the_callers_messages():
    msgs = [{"role": "user", "content": "x"}]
    with pytest.raises(InvalidRequest):
        render_chat("{{ messages.append({'role': 'system'}) }}", msgs)
    assert msgs == [{"role": "user", "content": "x"}]


def test_environment_renders_templates_written_for_transformers():
    """``{% break %}``, ``strftime_now`` and a ``tojson`` that does not HTML-escape, as
    transformers' apply_chat_template provides; real templates (Llama 3.1, Qwen tools) use them."""
    template = (
        "{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m['content'] | tojson }}{% endfor %}|{{ strftime_now('%Y') }}"
    )
    out = render_chat(template, [{"role": "user", "content": "a < b & 'c'"},
                                 {"role": "user", "content": "never rendered"}])
    text, year = out.split("|")
    assert text == '"a < b & \'c\'"'
    assert year.isdigit() and len(year) == 4


def test_chatml_fallback_is_logged_once(caplog):
    from ruvllm import chat

    chat._log_chatml_fallback.cache_clear()
    with caplog.at_level("WARNING", logger="ruvllm.chat"):
        for _ in range(3):
            render_chat(None, [{"role": "user", "content": "hi"}])
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "no chat template" in caplog.records[0].message
