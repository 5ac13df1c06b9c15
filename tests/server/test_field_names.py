"""A surface's table renames the shared core's fields into the ones its client sent, keeping the
rest of the path and the error itself (server/http/field_names.py)."""

from __future__ import annotations

from ruvllm.errors import ContextLengthExceeded, InvalidRequest
from ruvllm.server.http.field_names import FieldNames, in_terms

NAMES = FieldNames.of({"tools[*].function": "tools[*]", "stop": "stop_sequences", "prompt": "messages",
                       "tools[*].function.parameters": "tools[*].input_schema",
                       "max_tokens": "max_output_tokens"},
                      origins=["system", "messages[0]", "messages[1].content[2]"],
                      words={"max_tokens": "max_output_tokens"})


def test_a_prefix_is_renamed_at_a_field_boundary_and_the_rest_kept():
    assert NAMES.field("tools[3].function.name") == "tools[3].name"
    assert NAMES.field("tools[3].function.parameters.properties") == "tools[3].input_schema.properties"
    assert NAMES.field("stop[1]") == "stop_sequences[1]"
    assert NAMES.field("stop_token_ids") == "stop_token_ids"  # a longer name is another field
    assert NAMES.field("temperature") == "temperature"


def test_a_chat_message_is_named_by_where_it_came_from():
    assert NAMES.field("messages[2].tool_calls[0].function.arguments") == "messages[1].content[2]"
    assert NAMES.field("messages[0]") == "system"
    assert NAMES.field("messages[7]") == "messages[7]"  # no origin known: left as it is


def test_the_error_keeps_its_class_and_says_the_surfaces_words():
    exc = ContextLengthExceeded(9000, 4, 8192)
    renamed = NAMES.renamed(exc)
    assert renamed is exc and renamed.field == "messages" and str(renamed).startswith("messages: the prompt")
    # A word of the reason too, but not a longer name (the server's setting keeps its own).
    refusal = in_terms(InvalidRequest("max_tokens", "at most 512 (max_tokens_limit); lower max_tokens"),
                       NAMES)
    assert str(refusal) == "max_output_tokens: at most 512 (max_tokens_limit); lower max_output_tokens"
    assert in_terms("a token", NAMES) == "a token"


def test_speaking_renames_what_is_raised_inside():
    try:
        with NAMES.speaking():
            raise InvalidRequest("tools[0].function.name", "is defined twice")
    except InvalidRequest as exc:
        assert exc.field == "tools[0].name" and str(exc) == "tools[0].name: is defined twice"
