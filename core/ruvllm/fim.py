"""Fill-in-the-middle: a code model writes what goes between a prefix and a suffix.

Code models trained for it (StarCoder, Qwen2.5-Coder, DeepSeek-Coder and others) have three
control tokens, and the prompt is prefix-suffix-middle, as llama-server's ``/infill`` and
Ollama's templates build it: ``<prefix-token> prefix <suffix-token> suffix <middle-token>``; the
model then writes the middle, and its EOS (or a file separator) ends it. OpenAI's ``suffix`` on
``/v1/completions`` and Ollama's ``suffix`` on ``/api/generate`` ask for it; a model without
the tokens cannot, and is refused by name rather than given a prompt it was never trained on.

llama.cpp finds a GGUF's tokens itself (metadata, or the token texts it knows); a backend over
a Hugging Face tokenizer looks them up here by the texts of the families below.

Editors that talk to llama-server's ``/infill`` (llama.vim, llama.vscode) also send the cursor
line before the cursor (``prompt``) and chunks of other files (``input_extra``). Those go where
llama-server puts them: the line right after the prefix, the chunks before everything, each
under its file name where the model knows repository-level files (Qwen2.5-Coder, StarCoder2),
else behind a snippet marker. What fits follows llama-server's rule (:func:`fit_infill`), so an
editor that sends a whole file around the cursor gets the answer it got from llama-server.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ruvllm.types import FimTokens

#: (prefix, suffix, middle) token texts of model families that fill in, prefix-suffix-middle.
KNOWN_FIM_TOKENS = (
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),  # Qwen2.5-Coder, Qwen3-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),  # StarCoder(2), SantaCoder, Granite code
    # DeepSeek-Coder: fullwidth vertical bars and the SentencePiece space, as its tokenizer spells them
    ("<\uff5cfim\u2581begin\uff5c>", "<\uff5cfim\u2581hole\uff5c>", "<\uff5cfim\u2581end\uff5c>"),
)


#: A family's (repository name, file separator) token texts, by its prefix token's text.
KNOWN_REPO_TOKENS = {
    "<|fim_prefix|>": ("<|repo_name|>", "<|file_sep|>"),
    "<fim_prefix>": ("<repo_name>", "<file_sep>"),
}

#: llama-server's names for what its prompt says about the project (it has no field for them).
PROJECT_NAME = "myproject"
CURRENT_FILE = "filename"
#: What goes between chunks of other files for a model without a file separator.
SNIPPET_MARKER = "\n\n--- snippet ---\n\n"
#: llama-server's default batch: the budget of the file around the gap, three quarters before it.
INFILL_BATCH = 2048


def find_fim_tokens(token_id: Callable[[str], int | None]) -> FimTokens | None:
    """The model's fill-in-the-middle tokens, looked up by text (``token_id`` gives a token's id,
    or None when the vocabulary has no such token); None when no known family's three exist."""
    for texts in KNOWN_FIM_TOKENS:
        ids = [token_id(t) for t in texts]
        if all(i is not None for i in ids):
            prefix, suffix, middle = ids
            repo, file_sep = (token_id(t) for t in KNOWN_REPO_TOKENS.get(texts[0], ("", "")))
            both = repo is not None and file_sep is not None
            return FimTokens(prefix=prefix, suffix=suffix, middle=middle,  # type: ignore[arg-type]
                             repo=repo if both else None, file_sep=file_sep if both else None)
    return None


def extra_pieces(fim: FimTokens, files: Sequence[tuple[str, str]]) -> list[str | int]:
    """The other files (``(name, text)`` pairs) as llama-server lays them out before the prefix:
    text to tokenize and control-token ids, in order. A repository-level model gets the project
    and each file under its name, then the current file's; any other gets the texts apart."""
    if fim.repo is None or fim.file_sep is None:
        return [piece for _, text in files for piece in (SNIPPET_MARKER, text)]
    pieces: list[str | int] = [fim.repo, PROJECT_NAME + "\n"]
    for name, text in files:
        pieces += [fim.file_sep, name + "\n", text]
    return [*pieces, fim.file_sep, CURRENT_FILE + "\n"]


def fit_infill(prefix: list[int], suffix: list[int], line: list[int], extra: list[int], *,
               context: int, max_tokens: int) -> tuple[list[int], list[int], list[int]]:
    """llama-server's cut of an editor's context: the end of the prefix (three quarters of a
    batch: :data:`INFILL_BATCH`, or the context where that is smaller), the start of the suffix
    (the quarter left after the cursor line) and the end of the other files (the context beyond
    a batch and twice the answer)."""
    batch = min(INFILL_BATCH, context)
    keep_prefix = min(len(prefix), 3 * (batch // 4))
    keep_suffix = min(len(suffix), max(0, batch // 4 - (2 + len(line))))
    keep_extra = min(len(extra), max(0, context - batch - 2 * max_tokens))
    return prefix[len(prefix) - keep_prefix:], suffix[:keep_suffix], extra[len(extra) - keep_extra:]


def infill_ids(fim: FimTokens, head: list[int], prefix: list[int], suffix: list[int], *,
               line: Sequence[int] = (), extra: Sequence[int] = ()) -> list[int]:
    """The prompt that asks for the middle: ``extra`` (other files, :func:`extra_pieces`), ``head``
    (the BOS where the model wants one), then prefix-suffix-middle, with ``line`` (the cursor
    line before the cursor) right after the prefix, as llama-server builds it."""
    return [*extra, *head, fim.prefix, *prefix, *line, fim.suffix, *suffix, fim.middle]
