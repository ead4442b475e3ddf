"""The `inferwire` command line: run the server, and talk to one."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, NamedTuple, NoReturn

import grpc
import typer
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status
from typer.core import TyperCommand, TyperGroup

from inferwire import __version__
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc


def _without_flag_types(params: list[Any]) -> list[Any]:
    # typer prints a `<bool>` type after every flag; a flag takes no value, so show none.
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class _Command(TyperCommand):
    """A command whose help reads `Usage: inferwire infer [OPTIONS] MODEL [PROMPT]`."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        # typer writes a required argument as `{MODEL}`; the convention is plain MODEL.
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]


class _Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))


app = typer.Typer(help="inferwire: a gRPC inference service.", no_args_is_help=True, cls=_Group)
models_app = typer.Typer(help="List, load and unload models.", no_args_is_help=True, cls=_Group)
app.add_typer(models_app, name="models")
token_app = typer.Typer(
    help="Make bearer tokens for server.auth.tokens_file.", no_args_is_help=True, cls=_Group
)
app.add_typer(token_app, name="token")

DEFAULT_TARGET = "localhost:50051"
ADDRESS_ENV = "INFERWIRE_ADDRESS"
AddressOption = Annotated[
    str,
    typer.Option(
        "--address", "-a", envvar=ADDRESS_ENV, metavar="HOST:PORT", help="Server to call."
    ),
]
TimeoutOption = Annotated[
    float, typer.Option("--timeout", min=0, metavar="SECONDS", help="RPC deadline.")
]
TOKEN_ENV = "INFERWIRE_TOKEN"
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar=TOKEN_ENV,
        metavar="TOKEN",
        show_default=False,
        show_envvar=True,
        help="Bearer token sent as `authorization: Bearer TOKEN` (see `inferwire token new`).",
    ),
]
ModelArgument = Annotated[str, typer.Argument(metavar="MODEL", help="Model name.")]
TLS_CA_ENV, TLS_CERT_ENV, TLS_KEY_ENV = (
    "INFERWIRE_TLS_CA",
    "INFERWIRE_TLS_CERT",
    "INFERWIRE_TLS_KEY",
)


def _pem_file_option(flag: str, envvar: str, help: str) -> Any:
    return typer.Option(flag, envvar=envvar, dir_okay=False, metavar="PATH", help=help)


TlsCaOption = Annotated[
    Path | None,
    _pem_file_option(
        "--tls-ca",
        TLS_CA_ENV,
        "PEM CA certificates to verify the server's certificate with; turns TLS on.",
    ),
]
TlsCertOption = Annotated[
    Path | None,
    _pem_file_option(
        "--tls-cert",
        TLS_CERT_ENV,
        "PEM client certificate, for mutual TLS (with --tls-key); turns TLS on.",
    ),
]
TlsKeyOption = Annotated[
    Path | None, _pem_file_option("--tls-key", TLS_KEY_ENV, "PEM private key of --tls-cert.")
]

# The ranges the server accepts, so a mistake is refused here with the option's name.
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1


def _version(show: bool) -> None:
    if show:
        typer.echo(f"inferwire {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """inferwire: a gRPC inference service."""


class ClientTls(NamedTuple):
    """The client commands' --tls-ca, --tls-cert and --tls-key; all None: plaintext."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None

    def flags(self) -> list[tuple[str, str, Path | None]]:
        """(flag, environment variable, value) of each option."""
        return [
            ("--tls-ca", TLS_CA_ENV, self.ca),
            ("--tls-cert", TLS_CERT_ENV, self.cert),
            ("--tls-key", TLS_KEY_ENV, self.key),
        ]


PLAINTEXT = ClientTls()


def _with_tls_options(command: Callable[..., None]) -> Callable[..., None]:
    """Give a client command --tls-ca, --tls-cert and --tls-key, passed to it as `tls`."""
    options = [
        inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=option)
        for name, option in (
            ("tls_ca", TlsCaOption),
            ("tls_cert", TlsCertOption),
            ("tls_key", TlsKeyOption),
        )
    ]
    signature = inspect.signature(command, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != "tls"]

    @functools.wraps(command)
    def with_tls(
        *args: Any, tls_ca: Path | None, tls_cert: Path | None, tls_key: Path | None, **kwargs: Any
    ) -> None:
        command(*args, tls=ClientTls(tls_ca, tls_cert, tls_key), **kwargs)

    with_tls.__signature__ = signature.replace(parameters=[*own, *options])  # type: ignore[attr-defined]
    return with_tls


def _command_line(*words: str, address: str, tls: ClientTls) -> str:
    """The inferwire command to run next, against the same server, the same way."""
    given: list[tuple[str, str, str | None]] = [
        ("--address", address, os.environ.get(ADDRESS_ENV, DEFAULT_TARGET))
    ]
    given += [(flag, str(path), os.environ.get(env)) for flag, env, path in tls.flags() if path]
    for flag, value, default in given:
        if value != default:
            words = (*words, flag, value)
    return " ".join(("inferwire", *words))


def channel_credentials(tls: ClientTls) -> grpc.ChannelCredentials | None:
    """TLS credentials from the PEM files given, or None (plaintext) when none is given.

    Without --tls-ca the server is verified against the system's CA certificates;
    --tls-cert and --tls-key add a client certificate (mutual TLS).
    """
    if tls == PLAINTEXT:
        return None
    if (tls.cert is None) != (tls.key is None):
        raise typer.BadParameter(
            "give both, for mutual TLS", param_hint="'--tls-cert' and '--tls-key'"
        )
    contents: dict[str, bytes | None] = {}
    for flag, _, path in tls.flags():
        try:
            contents[flag] = path.read_bytes() if path else None
        except OSError as exc:
            raise typer.BadParameter(
                f"cannot read {path}: {exc.strerror or exc}", param_hint=f"'{flag}'"
            ) from None
    return grpc.ssl_channel_credentials(
        root_certificates=contents["--tls-ca"],
        private_key=contents["--tls-key"],
        certificate_chain=contents["--tls-cert"],
    )


@contextlib.contextmanager
def _connect(address: str, tls: ClientTls, model: str | None = None) -> Iterator[grpc.Channel]:
    """A channel to the server; a failed RPC inside prints its status and exits 1.

    `model` is the model the RPC runs on, for the hint to load it when it is not loaded.
    """
    credentials = channel_credentials(tls)
    with (
        grpc.secure_channel(address, credentials) if credentials else grpc.insecure_channel(address)
    ) as channel:
        try:
            yield channel
        except grpc.RpcError as error:
            hint = None
            if error.code() == grpc.StatusCode.NOT_FOUND:
                hint = _command_line("models", "list", address=address, tls=tls)
            elif error.code() == grpc.StatusCode.FAILED_PRECONDITION and model:
                hint = _command_line("models", "load", model, address=address, tls=tls)
            _fail(error, hint)


def _metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """The call metadata of every client command: the bearer token, when one is given."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def _field_violations(error: grpc.RpcError) -> list[Any]:
    status = rpc_status.from_call(error)
    violations: list[Any] = []
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            violations.extend(bad_request.field_violations)
    return violations


def _fail(error: grpc.RpcError, hint: str | None = None) -> NoReturn:
    """Print a failed RPC's code and message, or one line per field violation; exit 1."""
    violations = _field_violations(error)
    summary = error.details()
    if violations:  # the message only lists them again
        summary = f"{len(violations)} invalid field{'s' if len(violations) > 1 else ''}"
    typer.echo(f"error: {error.code().name}: {summary}", err=True)
    for violation in violations:
        typer.echo(f"  {violation.field}: {violation.description}", err=True)
    if hint:
        typer.echo(f"hint: {hint}", err=True)
    raise typer.Exit(1)


@app.command(cls=_Command)
def serve(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", envvar="INFERWIRE_CONFIG", help="YAML configuration file."),
    ] = None,
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            "-a",
            metavar="HOST:PORT",
            help="Address to listen on (default 0.0.0.0:50051; port 0 picks a free one).",
        ),
    ] = None,
    grace_period: Annotated[
        float | None,
        typer.Option(
            "--grace-period",
            metavar="SECONDS",
            help="How long in-flight RPCs may finish after SIGTERM (default 30).",
        ),
    ] = None,
    log_format: Annotated[
        str | None,
        typer.Option(
            "--log-format",
            metavar="FORMAT",
            help="auto (text on a terminal, JSON lines otherwise; the default), json or text.",
        ),
    ] = None,
    log_level: Annotated[
        str | None,
        typer.Option(
            "--log-level",
            metavar="LEVEL",
            help="CRITICAL, ERROR, WARNING, INFO (the default) or DEBUG, in any case.",
        ),
    ] = None,
) -> None:
    """Serve the configured models (by default the bundled `demo` model).

    Exit status: 0 after a drain on SIGTERM or SIGINT; 1 when the address cannot be
    listened on or a start-up model fails to load (unless server.exit_on_startup_failure
    is false); 2 for an invalid configuration.
    """
    from inferwire.api.server import StartupLoadError
    from inferwire.api.server import serve as run_server
    from inferwire.config import load_settings
    from inferwire.core.errors import ConfigurationError
    from inferwire.log import configure_logging

    flags = {
        "address": address,
        "grace_period_s": grace_period,
        "log_format": log_format,
        "log_level": log_level,
    }
    overrides = {k: v for k, v in flags.items() if v is not None}
    try:
        settings = load_settings(config, **({"server": overrides} if overrides else {}))
        configure_logging(settings.server.log_level, settings.server.log_format)
        asyncio.run(run_server(settings))
    except ConfigurationError as exc:
        typer.echo(f"error: invalid configuration: {exc}", err=True)
        raise typer.Exit(2) from None
    except StartupLoadError as exc:
        for name, why in exc.failures.items():
            typer.echo(f"error: model {name!r} failed to load: {why}", err=True)
        raise typer.Exit(1) from None
    except OSError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from None


def _as_stream_request(request: pb.InferRequest) -> pb.InferStreamRequest:
    """The same request for InferStream: the two messages share their field numbers."""
    return pb.InferStreamRequest.FromString(request.SerializeToString())


def _above_zero(value: float | None) -> float | None:
    if value is not None and value <= 0:
        raise typer.BadParameter(f"{value} is not in the range 0<x<=1.")
    return value


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
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
    try:
        return prompt_file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--prompt-file") from None


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


def _chat_messages(chat: list[str] | None, system: str | None) -> list[pb.ChatMessage]:
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


def _read_constraint(
    json_schema: Path | None, regex: str | None, lark_grammar: Path | None
) -> pb.OutputConstraint | None:
    given = [
        (flag, value)
        for flag, value in (
            ("--json-schema", json_schema),
            ("--regex", regex),
            ("--lark-grammar", lark_grammar),
        )
        if value is not None
    ]
    if not given:
        return None
    if len(given) > 1:
        raise typer.BadParameter(
            "give at most one constraint", param_hint=" / ".join(flag for flag, _ in given)
        )
    if regex is not None:
        return pb.OutputConstraint(regex=regex)
    flag, path = given[0]
    assert isinstance(path, Path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise typer.BadParameter(str(exc), param_hint=flag) from None
    if flag == "--json-schema":
        return pb.OutputConstraint(json_schema=text)
    return pb.OutputConstraint(lark_grammar=text)


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


@app.command(cls=_Command)
@_with_tls_options
def infer(
    model: ModelArgument,
    prompt: Annotated[
        str | None,
        typer.Argument(
            metavar="PROMPT",
            show_default=False,
            help="Prompt text, or - to read it from standard input (arguments are limited "
            "to about 128 KiB; use - or --prompt-file for more).",
        ),
    ] = None,
    prompt_file: Annotated[
        Path | None,
        typer.Option(
            "--prompt-file",
            "-f",
            dir_okay=False,
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
            min=0,
            max=1,
            callback=_above_zero,
            help="Nucleus sampling: keep the likeliest tokens up to this probability, in (0, 1].",
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
            max=20,
            metavar="N",
            help="Print each token's log-probability, with its N likeliest alternatives "
            "(0 to 20), to standard error.",
        ),
    ] = None,
    json_schema: Annotated[
        Path | None,
        typer.Option(
            "--json-schema",
            dir_okay=False,
            metavar="FILE",
            help="Constrain the output to JSON valid under the JSON Schema in FILE.",
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
            dir_okay=False,
            metavar="FILE",
            help="Constrain the output to the Lark grammar in FILE.",
        ),
    ] = None,
    show_usage: Annotated[
        bool,
        typer.Option(
            "--usage", help="Print finish reason, token counts and timing to standard error."
        ),
    ] = False,
    address: AddressOption = DEFAULT_TARGET,
    timeout: TimeoutOption = 300.0,
    tls: ClientTls = PLAINTEXT,
    token: TokenOption = None,
) -> None:
    """Generate text from MODEL for PROMPT or --chat messages; the text goes to standard output."""
    messages = _chat_messages(chat, system)
    if messages and (prompt is not None or prompt_file is not None):
        raise typer.BadParameter("give PROMPT or --chat messages, not both", param_hint="PROMPT")
    text = "" if messages else _read_prompt(prompt, prompt_file)
    params = pb.GenerationParameters(stop=stop or [])
    if logprobs is not None:
        params.logprobs = True
        params.top_logprobs = logprobs
    if (constraint := _read_constraint(json_schema, regex, lark_grammar)) is not None:
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
    final: pb.InferResponse | pb.InferStreamResponse | None = None
    entries: list[pb.TokenLogprob] = []
    # A chat refused for want of a template is FAILED_PRECONDITION too; loading is no cure.
    with _connect(address, tls, model=None if messages else model) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        if stream:
            for message in stub.InferStream(
                _as_stream_request(request), timeout=timeout, metadata=_metadata(token)
            ):
                sys.stdout.write(message.text)
                sys.stdout.flush()
                entries.extend(message.logprobs)
                final = message
            sys.stdout.write("\n")
        else:
            final = stub.Infer(request, timeout=timeout, metadata=_metadata(token))
            entries.extend(final.logprobs)
            typer.echo(final.text)
    for line in _logprob_lines(entries):
        typer.echo(line, err=True)
    if show_usage and final is not None:
        typer.echo(_usage_line(final), err=True)


@app.command(cls=_Command)
@_with_tls_options
def tokenize(
    model: ModelArgument,
    prompt: Annotated[
        str | None,
        typer.Argument(
            metavar="PROMPT", show_default=False, help="Text to tokenize, or - for standard input."
        ),
    ] = None,
    chat: ChatOption = None,
    system: SystemOption = None,
    address: AddressOption = DEFAULT_TARGET,
    timeout: TimeoutOption = 30.0,
    tls: ClientTls = PLAINTEXT,
    token: TokenOption = None,
) -> None:
    """The token ids MODEL sees for PROMPT, or for --chat messages through its chat template.

    Prints `count N`, then the ids on one line, then for messages the rendered prompt.
    """
    messages = _chat_messages(chat, system)
    if messages and prompt is not None:
        raise typer.BadParameter("give PROMPT or --chat messages, not both", param_hint="PROMPT")
    text = "" if messages else _read_prompt(prompt, None)
    request = pb.TokenizeRequest(model=model, prompt=text, messages=messages)
    with _connect(address, tls, model=None if messages else model) as channel:
        response = inference_pb2_grpc.InferenceServiceStub(channel).Tokenize(
            request, timeout=timeout, metadata=_metadata(token)
        )
    typer.echo(f"count {response.count}")
    typer.echo(" ".join(str(i) for i in response.token_ids))
    if messages:
        typer.echo(response.rendered_prompt, nl=False)


@app.command(cls=_Command)
@_with_tls_options
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
    address: AddressOption = DEFAULT_TARGET,
    timeout: TimeoutOption = 5.0,
    tls: ClientTls = PLAINTEXT,
    token: TokenOption = None,
) -> None:
    """grpc.health.v1 Check; exits 0 only when the service is SERVING."""
    with _connect(address, tls) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service),
            timeout=timeout,
            metadata=_metadata(token),
        )
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    typer.echo(status)
    if response.status != health_pb2.HealthCheckResponse.SERVING:
        raise typer.Exit(1)


def _print_status(status: pb.ModelStatus) -> None:
    line = f"{status.name:24} {status.backend:20} {pb.ModelState.Name(status.state)}"
    if status.detail:
        line += f"  ({status.detail})"
    typer.echo(line)


@models_app.command("list", cls=_Command)
@_with_tls_options
def models_list(
    address: AddressOption = DEFAULT_TARGET,
    timeout: TimeoutOption = 10.0,
    tls: ClientTls = PLAINTEXT,
    token: TokenOption = None,
) -> None:
    """List configured models and their states."""
    with _connect(address, tls) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        response = stub.ListModels(
            pb.ListModelsRequest(), timeout=timeout, metadata=_metadata(token)
        )
    for status in response.models:
        _print_status(status)


@models_app.command("load", cls=_Command)
@_with_tls_options
def models_load(
    model: ModelArgument,
    address: AddressOption = DEFAULT_TARGET,
    timeout: TimeoutOption = 600.0,
    tls: ClientTls = PLAINTEXT,
    token: TokenOption = None,
) -> None:
    """Load MODEL (idempotent)."""
    with _connect(address, tls) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        response = stub.LoadModel(
            pb.LoadModelRequest(model=model), timeout=timeout, metadata=_metadata(token)
        )
    _print_status(response.model)


@models_app.command("unload", cls=_Command)
@_with_tls_options
def models_unload(
    model: ModelArgument,
    address: AddressOption = DEFAULT_TARGET,
    timeout: TimeoutOption = 600.0,
    tls: ClientTls = PLAINTEXT,
    token: TokenOption = None,
) -> None:
    """Unload MODEL after its in-flight requests finish (idempotent)."""
    with _connect(address, tls) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        response = stub.UnloadModel(
            pb.UnloadModelRequest(model=model), timeout=timeout, metadata=_metadata(token)
        )
    _print_status(response.model)


@token_app.command("new", cls=_Command)
def token_new(
    name: Annotated[
        str, typer.Option("--name", metavar="NAME", help="Shown in logs instead of the token.")
    ],
    scope: Annotated[
        list[str],
        typer.Option("--scope", metavar="SCOPE", help="infer or admin; repeatable."),
    ],
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model", metavar="GLOB", help="A model it may use; repeatable (default: all)."
        ),
    ] = None,
) -> None:
    """Print a new random token (first line, shown only now), then its tokens-file entry."""
    from inferwire.core.auth import Scope, entry_yaml, hash_token, new_token

    try:
        scopes = [Scope(s) for s in scope]
    except ValueError:
        raise typer.BadParameter("each must be infer or admin", param_hint="--scope") from None
    token = new_token()
    typer.echo(token)
    typer.echo(entry_yaml(name, hash_token(token), scopes, model or []), nl=False)
    typer.echo(
        "the first line is the token, shown only now; append the rest to the tokens file",
        err=True,
    )


@token_app.command("hash", cls=_Command)
def token_hash() -> None:
    """Read a token on standard input; print the SHA-256 digest the tokens file stores."""
    from inferwire.core.auth import hash_token

    token = sys.stdin.read().strip()
    if not token:
        typer.echo("error: no token on standard input", err=True)
        raise typer.Exit(2)
    typer.echo(hash_token(token))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
