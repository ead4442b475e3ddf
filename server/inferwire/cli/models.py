"""`inferwire models list|load|unload`: the model admin RPCs, one status line per model."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from inferwire.cli.app import Command, ModelArgument, models_app
from inferwire.cli.connection import Target, client_command
from inferwire.core.memory import format_size
from inferwire.v1 import inference_pb2 as pb
from inferwire.v1 import inference_pb2_grpc


def _call(target: Target, timeout: float, method: str, request: Any) -> Any:
    """Call InferenceService.<method>; a failure prints its status (and hint) and exits 1."""
    with target.connect() as channel:
        rpc = getattr(inference_pb2_grpc.InferenceServiceStub(channel), method)
        return rpc(request, timeout=timeout, metadata=target.metadata)


def _print_status(status: pb.ModelStatus) -> None:
    line = f"{status.name:24} {status.backend:20} {pb.ModelState.Name(status.state)}"
    if residency := _residency(status):
        line += f"  [{residency}]"
    if status.detail:
        line += f"  ({status.detail})"
    typer.echo(line)


def _residency(status: pb.ModelStatus) -> str:
    """`resident 40.7 MiB, pinned, on-demand`: what the model holds, and how it may go."""
    tags = [f"adapter of {status.base_model}"] if status.base_model else []
    if status.resident_bytes:
        # A Triton pool's budget counts models: its footprint is 1, not a size.
        size = "" if status.backend == "triton" else f" {format_size(status.resident_bytes)}"
        tags.append(f"resident{size}")
    if status.pinned:
        tags.append("pinned")
    if status.on_demand:
        tags.append("on-demand")
    return ", ".join(tags)


@models_app.command("list", cls=Command)
@client_command(timeout=10.0)
def models_list(*, target: Target, timeout: float) -> None:
    """List configured models: state, memory held while resident, pinned, on-demand."""
    response = _call(target, timeout, "ListModels", pb.ListModelsRequest())
    for status in response.models:
        _print_status(status)
    if not response.models:  # said on standard error: standard output stays one line a model
        why = (
            "no model is visible to this token (its `models:` patterns match none)"
            if target.token
            else "the server lists no model: none is configured, or none is visible "
            "without a token (--token)"
        )
        typer.echo(why, err=True)


@models_app.command("load", cls=Command)
@client_command(timeout=600.0)
def models_load(
    model: ModelArgument,
    adapter_of: Annotated[
        str | None,
        typer.Option(
            "--adapter-of",
            metavar="BASE",
            help="Register MODEL at run time as a LoRA adapter of the model BASE "
            "(needs --adapter-path and the server's server.adapters.allowed_dirs).",
        ),
    ] = None,
    adapter_path: Annotated[
        str | None,
        typer.Option(
            "--adapter-path",
            metavar="PATH",
            help="The adapter: a .onnx_adapter file on the server, inside its allowed_dirs "
            "(or, for a Triton base, the lora_name).",
        ),
    ] = None,
    *,
    target: Target,
    timeout: float,
) -> None:
    """Load MODEL (idempotent); with --adapter-of and --adapter-path, register it first."""
    request = pb.LoadModelRequest(model=model)
    if (adapter_of is None) != (adapter_path is None):
        raise typer.BadParameter("--adapter-of and --adapter-path go together")
    if adapter_of is not None and adapter_path is not None:
        request.adapter.CopyFrom(pb.AdapterSource(base_model=adapter_of, path=adapter_path))
    _print_status(_call(target, timeout, "LoadModel", request).model)


@models_app.command("unload", cls=Command)
@client_command(timeout=600.0)
def models_unload(model: ModelArgument, *, target: Target, timeout: float) -> None:
    """Unload MODEL after its in-flight requests finish (idempotent)."""
    _print_status(_call(target, timeout, "UnloadModel", pb.UnloadModelRequest(model=model)).model)
