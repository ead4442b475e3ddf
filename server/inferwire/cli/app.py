"""The `inferwire` typer application and its command groups; the commands add themselves."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperCommand, TyperGroup

from inferwire import __version__


def _without_flag_types(params: list[Any]) -> list[Any]:
    # typer prints a `<bool>` type after every flag; a flag takes no value, so show none.
    for param in params:
        if getattr(param, "is_flag", False) and param.metavar is None:
            param.metavar = ""
    return params


class Command(TyperCommand):
    """A command whose help reads `Usage: inferwire infer [OPTIONS] MODEL [PROMPT]`."""

    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        # typer writes a required argument as `{MODEL}`; the convention is plain MODEL.
        pieces = super().collect_usage_pieces(ctx)
        return [p[1:-1] if p.startswith("{") and p.endswith("}") else p for p in pieces]


class Group(TyperGroup):
    def get_params(self, ctx: Any) -> list[Any]:
        return _without_flag_types(super().get_params(ctx))


app = typer.Typer(help="inferwire: a gRPC inference service.", no_args_is_help=True, cls=Group)
models_app = typer.Typer(
    help="List, load, unload and import models.", no_args_is_help=True, cls=Group
)
app.add_typer(models_app, name="models")
token_app = typer.Typer(
    help="Make bearer tokens for server.auth.tokens_file.", no_args_is_help=True, cls=Group
)
app.add_typer(token_app, name="token")

ModelArgument = Annotated[str, typer.Argument(metavar="MODEL", help="Model name.")]


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
