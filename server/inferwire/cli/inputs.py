"""What a client command sends, read from its arguments, options and files and checked
here, so a mistake is refused with the option's name before anything is called."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from inferwire.cli.files import read_json, read_text
from inferwire.core.errors import InvalidArgumentError
from inferwire.core.requests import InferenceRequest
from inferwire.core.sampling import GenerationParams
from inferwire.core.validation import RequestLimits, validate_inference_request
from inferwire.v1 import inference_pb2 as pb

ChatOption = Annotated[
    list[str] | None,
    typer.Option(
        "--chat",
        metavar="ROLE: TEXT",
        help="A chat message instead of PROMPT, e.g. 'user: Good morrow' (roles: system, "
        "user, assistant); repeatable, in order. The model's chat template renders them.",
    ),
]
SystemOption = Annotated[
    str | None,
    typer.Option(
        "--system", metavar="TEXT", help="A system message placed before the --chat messages."
    ),
]


def checked_by_the_server_rule(parameter: str) -> Callable[[float | None], float | None]:
    """An option callback that refuses what the server refuses for `parameters.<parameter>`,
    with its words: the core's validation is the one rule."""
    field = f"parameters.{parameter}"

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        given: dict[str, Any] = {parameter: value}
        request = InferenceRequest(
            request_id="", model="m", prompt="p", params=GenerationParams(**given)
        )
        try:
            validate_inference_request(request, RequestLimits(max_prompt_bytes=1))
        except InvalidArgumentError as exc:
            for violation in exc.violations:
                if violation.field == field:
                    raise typer.BadParameter(violation.description) from None
        return value

    return check


def read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    """The prompt from the argument, standard input (`-`) or a UTF-8 file, verbatim."""
    if (prompt is None) == (prompt_file is None):
        raise typer.BadParameter(
            "give the prompt once: as PROMPT, as '-' to read standard input, "
            "or with --prompt-file PATH",
            param_hint="PROMPT",
        )
    if prompt == "-" or prompt_file == Path("-"):
        return sys.stdin.read()
    if prompt_file is None:
        return str(prompt)
    return read_text(prompt_file, "--prompt-file")


def chat_messages(chat: list[str] | None, system: str | None) -> list[pb.ChatMessage]:
    """`--system` and each `--chat 'role: text'` as messages, in order."""
    if system is not None and not chat:
        raise typer.BadParameter("needs at least one --chat message", param_hint="--system")
    messages = [] if system is None else [pb.ChatMessage(role="system", content=system)]
    for entry in chat or []:
        role, colon, content = entry.partition(":")
        if not colon:
            raise typer.BadParameter(
                f"{entry!r} has no role; write it as 'user: text'", param_hint="--chat"
            )
        messages.append(pb.ChatMessage(role=role.strip(), content=content.removeprefix(" ")))
    return messages


def read_constraint(
    json_schema: Path | None, regex: str | None, lark_grammar: Path | None
) -> pb.OutputConstraint | None:
    """The one output constraint given, if any; a JSON Schema file must hold JSON."""
    given = [
        flag
        for flag, value in (
            ("--json-schema", json_schema),
            ("--regex", regex),
            ("--lark-grammar", lark_grammar),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise typer.BadParameter("give at most one constraint", param_hint=" / ".join(given))
    if regex is not None:
        return pb.OutputConstraint(regex=regex)
    if json_schema is not None:
        return pb.OutputConstraint(json_schema=read_json(json_schema, "--json-schema"))
    if lark_grammar is not None:
        return pb.OutputConstraint(lark_grammar=read_text(lark_grammar, "--lark-grammar"))
    return None
