"""The `inferwire` command line: run the server, and talk to one."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, NoReturn

import grpc
import typer
from google.protobuf import json_format
from google.rpc import error_details_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_status import rpc_status

from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc

app = typer.Typer(help="inferwire: a gRPC inference service.", no_args_is_help=True)
models_app = typer.Typer(help="List, load and unload models.", no_args_is_help=True)
app.add_typer(models_app, name="models")

DEFAULT_TARGET = "localhost:50051"
AddressOption = Annotated[str, typer.Option("--address", "-a", help="Server address, host:port.")]
TimeoutOption = Annotated[float, typer.Option("--timeout", help="RPC deadline in seconds.")]


@contextlib.contextmanager
def _connect(address: str) -> Iterator[grpc.Channel]:
    """A channel to the server; a failed RPC inside prints its status and exits 1."""
    with grpc.insecure_channel(address) as channel:
        try:
            yield channel
        except grpc.RpcError as error:
            _fail(error)


def _fail(error: grpc.RpcError) -> NoReturn:
    """Print a failed RPC's code, message and field violations; exit 1."""
    typer.echo(f"error: {error.code().name}: {error.details()}", err=True)
    status = rpc_status.from_call(error)
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad_request = error_details_pb2.BadRequest()
                detail.Unpack(bad_request)
                for violation in bad_request.field_violations:
                    typer.echo(f"  {violation.field}: {violation.description}", err=True)
    raise typer.Exit(1)


@app.command()
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


@app.command()
def infer(
    model: Annotated[str, typer.Argument(help="Model name.")],
    prompt: Annotated[str, typer.Argument(help="Prompt text.")],
    stream: Annotated[
        bool, typer.Option("--stream", help="Print text as it is generated.")
    ] = False,
    max_tokens: Annotated[int | None, typer.Option("--max-tokens")] = None,
    temperature: Annotated[float | None, typer.Option("--temperature")] = None,
    top_p: Annotated[float | None, typer.Option("--top-p")] = None,
    top_k: Annotated[int | None, typer.Option("--top-k")] = None,
    seed: Annotated[int | None, typer.Option("--seed", min=0, max=2**32 - 1)] = None,
    stop: Annotated[
        list[str] | None, typer.Option("--stop", help="Stop string; repeatable.")
    ] = None,
    context: Annotated[
        list[str] | None, typer.Option("--context", help="Context passage; repeatable.")
    ] = None,
    show_usage: Annotated[
        bool, typer.Option("--usage", help="Print finish reason, usage and timing to stderr.")
    ] = False,
    address: AddressOption = DEFAULT_TARGET,
    timeout: TimeoutOption = 300.0,
) -> None:
    """Generate text from MODEL for PROMPT."""
    params = pb.GenerationParameters(stop=stop or [])
    for name, value in (
        ("max_tokens", max_tokens),
        ("temperature", temperature),
        ("top_p", top_p),
        ("top_k", top_k),
        ("seed", seed),
    ):
        if value is not None:
            setattr(params, name, value)
    request = pb.InferRequest(model=model, prompt=prompt, context=context or [], parameters=params)
    with _connect(address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        if stream:
            final = None
            for message in stub.InferStream(_as_stream_request(request), timeout=timeout):
                sys.stdout.write(message.text)
                sys.stdout.flush()
                final = message
            sys.stdout.write("\n")
        else:
            final = stub.Infer(request, timeout=timeout)
            typer.echo(final.text)
    if show_usage and final is not None:
        summary = {
            "request_id": final.request_id,
            "finish_reason": pb.FinishReason.Name(final.finish_reason),
            "usage": json_format.MessageToDict(final.usage),
            "timing": json_format.MessageToDict(final.timing),
        }
        typer.echo(json.dumps(summary), err=True)


@app.command()
def health(
    service: Annotated[
        str, typer.Option("--service", "-s", help="'' (server), or model/<name>.")
    ] = "",
    address: AddressOption = DEFAULT_TARGET,
    timeout: TimeoutOption = 5.0,
) -> None:
    """grpc.health.v1 Check; exits 0 only when the service is SERVING."""
    with _connect(address) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=timeout
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


@models_app.command("list")
def models_list(address: AddressOption = DEFAULT_TARGET, timeout: TimeoutOption = 10.0) -> None:
    """List configured models and their states."""
    with _connect(address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        response = stub.ListModels(pb.ListModelsRequest(), timeout=timeout)
    for status in response.models:
        _print_status(status)


@models_app.command("load")
def models_load(
    model: str, address: AddressOption = DEFAULT_TARGET, timeout: TimeoutOption = 600.0
) -> None:
    """Load MODEL (idempotent)."""
    with _connect(address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        response = stub.LoadModel(pb.LoadModelRequest(model=model), timeout=timeout)
    _print_status(response.model)


@models_app.command("unload")
def models_unload(
    model: str, address: AddressOption = DEFAULT_TARGET, timeout: TimeoutOption = 600.0
) -> None:
    """Unload MODEL after its in-flight requests finish (idempotent)."""
    with _connect(address) as channel:
        stub = inference_pb2_grpc.InferenceServiceStub(channel)
        response = stub.UnloadModel(pb.UnloadModelRequest(model=model), timeout=timeout)
    _print_status(response.model)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
