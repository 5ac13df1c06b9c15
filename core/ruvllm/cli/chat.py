"""``ruvllm chat [MODEL]``: an interactive conversation in the terminal, streamed as it generates.

The conversation is kept as messages and rendered with the model's own chat template on every
turn. Slash commands change the session; errors (a too-long conversation, a bad value) print
one line and the session goes on. Ctrl-C stops a reply being generated; Ctrl-D or /quit leaves.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import attrs
import click

from ruvllm.cli.app import backend_option, config_from, main, options_option
from ruvllm.cli.generate import sampling_options
from ruvllm.errors import ContextLengthExceeded, RuvllmError
from ruvllm.llm import LLM
from ruvllm.types import GenerationParams

PROMPT = "you> "
HELP = """commands:
  /help             show this help
  /clear            forget the conversation (keeps the system prompt)
  /system [TEXT]    set the system prompt (no TEXT: remove it)
  /temp VALUE       set the temperature (0 = greedy)
  /max N            set the most tokens per reply
  /history          show the conversation so far
  /quit, /exit      leave (Ctrl-D works too; Ctrl-C stops a reply)"""


@attrs.define
class ChatSession:
    """Conversation state and the slash commands that change it; no terminal I/O here."""

    params: GenerationParams
    system: str | None = None
    history: list[dict[str, str]] = attrs.field(factory=list)

    def messages(self, user: str | None = None) -> list[dict[str, str]]:
        out = [{"role": "system", "content": self.system}] if self.system else []
        out += self.history
        if user is not None:
            out.append({"role": "user", "content": user})
        return out

    def command(self, line: str) -> str | None:
        """Run a slash command; returns the text to show, or None to quit."""
        name, _, arg = line.strip().partition(" ")
        arg = arg.strip()
        handlers: dict[str, Callable[[str], str | None]] = {
            "/help": lambda a: HELP, "/quit": lambda a: None, "/exit": lambda a: None,
            "/clear": self._clear, "/system": self._system, "/temp": self._temp, "/max": self._max,
            "/history": self._history,
        }
        handler = handlers.get(name)
        if handler is None:
            return f"unknown command {name}; type /help"
        return handler(arg)

    def _clear(self, arg: str) -> str:
        self.history.clear()
        return "history cleared"

    def _system(self, arg: str) -> str:
        self.system = arg or None
        self.history.clear()
        return f"system prompt set: {arg}" if arg else "system prompt removed"

    def _temp(self, arg: str) -> str:
        return self._set_param("temperature", float, arg, "/temp needs a number between 0 and 2")

    def _max(self, arg: str) -> str:
        return self._set_param("max_tokens", int, arg, "/max needs a whole number >= 1")

    def _set_param(self, field: str, convert, arg: str, usage: str) -> str:
        """Change one sampling parameter; GenerationParams validates it, the REPL keeps going."""
        try:
            self.params = attrs.evolve(self.params, **{field: convert(arg)})
        except ValueError:
            return f"error: {usage}, got {arg!r}"
        except RuvllmError as exc:
            return f"error: {exc}"
        label = "max tokens" if field == "max_tokens" else field
        return f"{label} = {getattr(self.params, field)}"

    def _history(self, arg: str) -> str:
        if not self.messages():
            return "(empty)"
        return "\n".join(f"[{m['role']}] {m['content']}" for m in self.messages())


def _enable_line_history() -> None:
    """Arrow-key editing and recall of earlier lines where the platform has readline."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (importing it is what enables editing in input())


def _reply(llm: LLM, session: ChatSession, user: str) -> None:
    messages = session.messages(user)
    try:
        ids = llm.chat_prompt(messages)
        stream = llm.stream(ids, session.params)
    except ContextLengthExceeded as exc:
        click.secho(f"error: {exc} (use /clear to start over)", fg="red", err=True)
        return
    parts: list[str] = []
    try:
        for out in stream:
            parts.append(out.text)
            sys.stdout.write(out.text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        sys.stdout.write(" [stopped]")
    sys.stdout.write("\n")
    session.history += [{"role": "user", "content": user}, {"role": "assistant", "content": "".join(parts)}]
    result = stream.result
    if result is not None:
        click.secho(f"[{result.usage.completion_tokens} tokens, {result.decode_tokens_per_second:.1f} tok/s, "
                    f"{result.finish_reason.value}]", dim=True, err=True)


@main.command()
@click.argument("model", required=False)
@backend_option
@options_option
@sampling_options
@click.option("--system", help="System prompt for the conversation.")
@click.pass_context
def chat(ctx: click.Context, model: str | None, backend: str | None, options: tuple[str, ...],
         system: str | None, **sampling) -> None:
    """Chat with MODEL (default: the embedded model) in the terminal; /help lists commands."""
    sampling["stop"] = tuple(sampling["stop"])
    config = config_from(ctx, backend=backend, model=model, options=options)
    session = ChatSession(params=GenerationParams(**sampling), system=system)
    with LLM(config=config) as llm:
        _enable_line_history()
        click.echo(f"chatting with {llm.model.name} on {llm.backend_name}; "
                   "/help for commands, /quit to leave")
        while True:
            try:
                line = input(PROMPT)
            except EOFError:
                click.echo("")
                return
            except KeyboardInterrupt:
                click.echo("")
                return
            if not line.strip():
                continue
            if line.startswith("/"):
                text = session.command(line)
                if text is None:
                    return
                click.echo(text)
                continue
            try:
                _reply(llm, session, line)
            except RuvllmError as exc:
                click.secho(f"error: {exc}", fg="red", err=True)
