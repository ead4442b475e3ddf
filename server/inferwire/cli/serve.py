"""`inferwire serve`: run the server with the configuration file, environment and flags."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from inferwire.cli.app import Command, app
from inferwire.cli.files import read_text


def _setting(flag: str, metavar: str, help: str, *aliases: str) -> typer.models.OptionInfo:
    """A serve flag that overrides one `server.*` setting."""
    return typer.Option(flag, *aliases, metavar=metavar, help=help)


_ADDRESS_HELP = "Address to listen on (default 0.0.0.0:50051; port 0 picks a free one)."
_METRICS_HELP = (
    "Where Prometheus scrapes /metrics (default 0.0.0.0:9464; port 0 picks a free one); "
    "'' turns metrics off. Sets server.metrics_address."
)
_HTTP_HELP = (
    "Address of the OpenAI-compatible HTTP API (default 0.0.0.0:8000; port 0 picks a free "
    "one); '' turns it off. Sets server.http_address."
)
_GRACE_HELP = "How long in-flight RPCs may finish after SIGTERM (default 30)."
_LOG_FORMAT_HELP = "auto (text on a terminal, JSON lines otherwise; the default), json or text."
_LOG_LEVEL_HELP = "CRITICAL, ERROR, WARNING, INFO (the default) or DEBUG, in any case."


@app.command(cls=Command)
def serve(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", envvar="INFERWIRE_CONFIG", help="YAML configuration file."),
    ] = None,
    address: Annotated[str | None, _setting("--address", "HOST:PORT", _ADDRESS_HELP, "-a")] = None,
    http_address: Annotated[str | None, _setting("--http-address", "HOST:PORT", _HTTP_HELP)] = None,
    metrics_address: Annotated[
        str | None, _setting("--metrics-address", "HOST:PORT", _METRICS_HELP)
    ] = None,
    grace_period: Annotated[
        float | None, _setting("--grace-period", "SECONDS", _GRACE_HELP)
    ] = None,
    log_format: Annotated[str | None, _setting("--log-format", "FORMAT", _LOG_FORMAT_HELP)] = None,
    log_level: Annotated[str | None, _setting("--log-level", "LEVEL", _LOG_LEVEL_HELP)] = None,
) -> None:
    """Serve the configured models (by default the bundled `demo` model).

    Exit status: 0 after a drain on SIGTERM or SIGINT; 1 when the address cannot be
    listened on or a start-up model fails to load (unless server.exit_on_startup_failure
    is false); 2 for an invalid configuration.
    """
    from inferwire.backends import backend_class
    from inferwire.config import load_settings
    from inferwire.core.errors import ConfigurationError
    from inferwire.log import configure_logging
    from inferwire.server import StartupLoadError
    from inferwire.server import serve as run_server

    if config is not None:
        read_text(config, "--config")  # unreadable: refused like every file flag
    given = {
        "address": address,
        "http_address": http_address,
        "metrics_address": metrics_address,
        "grace_period_s": grace_period,
        "log_format": log_format,
        "log_level": log_level,
    }
    overrides = {k: v for k, v in given.items() if v is not None}
    try:
        settings = load_settings(
            config, backend_class, **({"server": overrides} if overrides else {})
        )
        # Every line is written before an error below is printed, and before exit.
        with configure_logging(settings.server.log_level, settings.server.log_format):
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
