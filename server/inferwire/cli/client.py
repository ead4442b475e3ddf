"""The client commands that run a model or ask about the server: infer, tokenize, health."""

from __future__ import annotations

import enum
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from grpc_health.v1 import health_pb2, health_pb2_grpc

from inferwire.cli.app import Command, ModelArgument, app
from inferwire.cli.connection import Target, client_command
from inferwire.cli.inputs import (
    ChatOption,
    SystemOption,
    chat_messages,
    checked_by_the_server_rule,
    read_constraint,
    read_prompt,
)
from inferwire.core.sampling import MAX_TOP_LOGPROBS
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

# The wire types' ranges, so a value the message cannot hold is refused with the option's name.
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1


class PriorityChoice(enum.StrEnum):
    """The --priority values, as server.tenants spells them."""

    INTERACTIVE = "interactive"
    STANDARD = "standard"
    BATCH = "batch"


PRIORITY_ON_THE_WIRE = {
    PriorityChoice.INTERACTIVE: pb.PRIORITY_INTERACTIVE,
    PriorityChoice.STANDARD: pb.PRIORITY_STANDARD,
    PriorityChoice.BATCH: pb.PRIORITY_BATCH,
}


def _prompt_argument(help: str) -> Any:
    return typer.Argument(metavar="PROMPT", show_default=False, help=help)


def _as_stream_request(request: pb.InferRequest) -> pb.InferStreamRequest:
    """The same request for InferStream: the two messages share their field numbers."""
    return pb.InferStreamRequest.FromString(request.SerializeToString())


def _logprob_lines(entries: list[pb.TokenLogprob]) -> list[str]:
    """One line per token: its log-probability, id and text, then its alternatives."""
    lines = []
    for entry in entries:
        line = f"{entry.logprob:9.4f} {entry.token_id:6d} {entry.token!r}"
        if entry.top:
            line += "  top: " + ", ".join(f"{alt.token!r} {alt.logprob:.4f}" for alt in entry.top)
        lines.append(line)
    return lines


def _usage_line(final: pb.InferResponse | pb.InferStreamResponse) -> str:
    """Outcome, usage and timing as `key=value` pairs, with times in 0.1 ms."""
    reason = pb.FinishReason.Name(final.finish_reason).removeprefix("FINISH_REASON_")
    timing = final.timing
    return (
        f"finish_reason={reason} prompt_tokens={final.usage.prompt_tokens} "
        f"completion_tokens={final.usage.completion_tokens} queue_ms={timing.queue_ms:.1f} "
        f"ttft_ms={timing.time_to_first_token_ms:.1f} total_ms={timing.total_ms:.1f} "
        f"request_id={final.request_id}"
    )


@app.command(cls=Command)
@client_command(timeout=300.0)
def infer(
    model: ModelArgument,
    prompt: Annotated[
        str | None,
        _prompt_argument(
            "Prompt text, or - to read it from standard input (arguments are limited "
            "to about 128 KiB; use - or --prompt-file for more)."
        ),
    ] = None,
    prompt_file: Annotated[
        Path | None,
        typer.Option(
            "--prompt-file",
            "-f",
            allow_dash=True,
            metavar="PATH",
            help="Read the prompt from this UTF-8 file (- for standard input), verbatim.",
        ),
    ] = None,
    stream: Annotated[
        bool, typer.Option("--stream", help="Print text as it is generated (InferStream).")
    ] = False,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            "--max-tokens", min=1, max=INT32_MAX, help="Most tokens to generate (model default)."
        ),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(
            "--temperature", min=0, help="Sampling temperature; 0 is greedy (model default)."
        ),
    ] = None,
    top_p: Annotated[
        float | None,
        typer.Option(
            "--top-p",
            metavar="P",
            callback=checked_by_the_server_rule("top_p"),
            help="Nucleus sampling: keep the likeliest tokens up to this probability; "
            "0 < P <= 1 (model default).",
        ),
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option(
            "--top-k",
            min=0,
            max=INT32_MAX,
            help="Sample from the k likeliest tokens; 0 means no limit (model default).",
        ),
    ] = None,
    seed: Annotated[
        int | None,
        typer.Option(
            "--seed",
            min=0,
            max=UINT32_MAX,
            help="Random seed, for repeatable sampling (the embedded engine takes up to "
            f"{INT32_MAX}).",
        ),
    ] = None,
    stop: Annotated[
        list[str] | None,
        typer.Option("--stop", metavar="TEXT", help="End the text where this appears; repeatable."),
    ] = None,
    context: Annotated[
        list[str] | None,
        typer.Option(
            "--context",
            metavar="TEXT",
            help="A source passage placed before the prompt; repeatable.",
        ),
    ] = None,
    chat: ChatOption = None,
    system: SystemOption = None,
    logprobs: Annotated[
        int | None,
        typer.Option(
            "--logprobs",
            min=0,
            max=MAX_TOP_LOGPROBS,
            metavar="N",
            help="Print each token's log-probability, with its N likeliest alternatives "
            f"(0 to {MAX_TOP_LOGPROBS}), to standard error.",
        ),
    ] = None,
    json_schema: Annotated[
        Path | None,
        typer.Option(
            "--json-schema",
            metavar="FILE",
            help="Constrain the output to JSON valid under the JSON Schema in FILE "
            "(checked to be JSON before the call).",
        ),
    ] = None,
    regex: Annotated[
        str | None,
        typer.Option("--regex", metavar="PATTERN", help="Constrain the output to match PATTERN."),
    ] = None,
    lark_grammar: Annotated[
        Path | None,
        typer.Option(
            "--lark-grammar",
            metavar="FILE",
            help="Constrain the output to the Lark grammar in FILE.",
        ),
    ] = None,
    priority: Annotated[
        PriorityChoice | None,
        typer.Option(
            "--priority",
            help="Run at this priority: your tenant's or lower, never higher (your tenant's).",
        ),
    ] = None,
    show_usage: Annotated[
        bool,
        typer.Option(
            "--usage", help="Print finish reason, token counts and timing to standard error."
        ),
    ] = False,
    *,
    target: Target,
    timeout: float,
) -> None:
    """Generate text from MODEL for PROMPT or --chat messages; the text goes to standard output."""
    messages = chat_messages(chat, system)
    if messages and (prompt is not None or prompt_file is not None):
        raise typer.BadParameter("give PROMPT or --chat messages, not both", param_hint="PROMPT")
    text = "" if messages else read_prompt(prompt, prompt_file)
    params = pb.GenerationParameters(stop=stop or [])
    if logprobs is not None:
        params.logprobs = True
        params.top_logprobs = logprobs
    if (constraint := read_constraint(json_schema, regex, lark_grammar)) is not None:
        params.constraint.CopyFrom(constraint)
    for name, value in (
        ("max_tokens", max_tokens),
        ("temperature", temperature),
        ("top_p", top_p),
        ("top_k", top_k),
        ("seed", seed),
    ):
        if value is not None:
            setattr(params, name, value)
    request = pb.InferRequest(
        model=model, prompt=text, messages=messages, context=context or [], parameters=params
    )
    if priority is not None:
        request.priority = PRIORITY_ON_THE_WIRE[priority]
    final: pb.InferResponse | pb.InferStreamResponse | None = None
    entries: list[pb.TokenLogprob] = []
    # A chat refused for want of a template is FAILED_PRECONDITION too; loading is no cure.
    with target.connect(model=None if messages else model) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        if stream:
            for message in stub.InferStream(
                _as_stream_request(request), timeout=timeout, metadata=target.metadata
            ):
                sys.stdout.write(message.text)
                sys.stdout.flush()
                entries.extend(message.logprobs)
                final = message
            sys.stdout.write("\n")
        else:
            final = stub.Infer(request, timeout=timeout, metadata=target.metadata)
            entries.extend(final.logprobs)
            typer.echo(final.text)
    for line in _logprob_lines(entries):
        typer.echo(line, err=True)
    if show_usage and final is not None:
        typer.echo(_usage_line(final), err=True)


@app.command(cls=Command)
@client_command(timeout=30.0)
def tokenize(
    model: ModelArgument,
    prompt: Annotated[
        str | None, _prompt_argument("Text to tokenize, or - for standard input.")
    ] = None,
    chat: ChatOption = None,
    system: SystemOption = None,
    *,
    target: Target,
    timeout: float,
) -> None:
    """The token ids MODEL sees for PROMPT, or for --chat messages through its chat template.

    Prints `count N`, then the ids on one line, then for messages the rendered prompt.
    """
    messages = chat_messages(chat, system)
    if messages and prompt is not None:
        raise typer.BadParameter("give PROMPT or --chat messages, not both", param_hint="PROMPT")
    text = "" if messages else read_prompt(prompt, None)
    request = pb.TokenizeRequest(model=model, prompt=text, messages=messages)
    with target.connect(model=None if messages else model) as channel:
        response = inference_pb2_grpc.InferenceServiceStub(channel).Tokenize(
            request, timeout=timeout, metadata=target.metadata
        )
    typer.echo(f"count {response.count}")
    typer.echo(" ".join(str(i) for i in response.token_ids))
    if messages:
        typer.echo(response.rendered_prompt, nl=False)


@app.command(cls=Command)
@client_command(timeout=5.0)
def health(
    service: Annotated[
        str,
        typer.Option(
            "--service",
            "-s",
            metavar="NAME",
            show_default=False,
            help="What to check: the whole server (the default), model/<name> for one model, "
            "or inferwire.v1.InferenceService.",
        ),
    ] = "",
    *,
    target: Target,
    timeout: float,
) -> None:
    """grpc.health.v1 Check; exits 0 only when the service is SERVING."""
    with target.connect() as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service),
            timeout=timeout,
            metadata=target.metadata,
        )
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    typer.echo(status)
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        raise typer.Exit(1)
