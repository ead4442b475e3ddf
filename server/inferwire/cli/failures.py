"""How a client command reports a failed RPC: its code and message, each invalid field,
and a `hint:` line saying what to try next."""

from __future__ import annotations

from typing import Any, NoReturn

import grpc
import typer
from google.rpc import error_details_pb2
from grpc_status import rpc_status


def _field_violations(error: grpc.RpcError) -> list[Any]:
    status = rpc_status.from_call(error)
    violations: list[Any] = []
    for detail in status.details if status is not None else []:
        if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad_request = error_details_pb2.BadRequest()
            detail.Unpack(bad_request)
            violations.extend(bad_request.field_violations)
    return violations


def fail(error: grpc.RpcError, hint: str | None = None) -> NoReturn:
    """Print a failed RPC's code and message, or one line per field violation; exit 1."""
    violations = _field_violations(error)
    summary = error.details()
    if violations:  # the message only lists them again
        summary = f"{len(violations)} invalid field{'s' if len(violations) > 1 else ''}"
    typer.echo(f"error: {error.code().name}: {summary}", err=True)
    for violation in violations:
        typer.echo(f"  {violation.field}: {violation.description}", err=True)
    if hint:
        print_hint(hint)
    raise typer.Exit(1)


def print_hint(hint: str) -> None:
    typer.echo(f"hint: {hint}", err=True)
