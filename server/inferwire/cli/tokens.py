"""`inferwire token new|hash`: bearer tokens and their tokens-file entries (no server needed)."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from inferwire.cli.app import Command, token_app


@token_app.command("new", cls=Command)
def token_new(
    name: Annotated[
        str, typer.Option("--name", metavar="NAME", help="Shown in logs instead of the token.")
    ],
    scope: Annotated[
        list[str],
        typer.Option(
            "--scope",
            metavar="SCOPE",
            help="infer or admin (or gateway, for an inference gateway); repeatable.",
        ),
    ],
    model: Annotated[
        list[str] | None,
        typer.Option(
            "--model", metavar="GLOB", help="A model it may use; repeatable (default: all)."
        ),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(
            "--tenant",
            metavar="NAME",
            help="The tenant of server.tenants it counts against (default: its own).",
        ),
    ] = None,
) -> None:
    """Print a new random token (first line, shown only now), then its tokens-file entry."""
    from inferwire.core.auth import Scope, entry_yaml, hash_token, new_token

    try:
        scopes = [Scope(s) for s in scope]
    except ValueError:
        raise typer.BadParameter(
            "each must be infer or admin (or gateway)", param_hint="--scope"
        ) from None
    token = new_token()
    typer.echo(token)
    typer.echo(entry_yaml(name, hash_token(token), scopes, model or [], tenant), nl=False)
    typer.echo(
        "the first line is the token, shown only now; append the rest to the tokens file",
        err=True,
    )


@token_app.command("hash", cls=Command)
def token_hash() -> None:
    """Read a token on standard input; print the SHA-256 digest the tokens file stores."""
    from inferwire.core.auth import hash_token

    token = sys.stdin.read().strip()
    if not token:
        typer.echo("error: no token on standard input", err=True)
        raise typer.Exit(2)
    typer.echo(hash_token(token))
