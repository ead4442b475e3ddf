"""`inferwire serve`: run the server with the configuration file, environment and flags."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from inferwire.cli.app import Command, app
from inferwire.cli.files import read_text


@app.command(cls=Command)
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
    metrics_address: Annotated[
        str | None,
        typer.Option(
            "--metrics-address",
            metavar="HOST:PORT",
            help="Where Prometheus scrapes /metrics (default 0.0.0.0:9464; port 0 picks a "
            "free one); '' turns metrics off. Sets server.metrics_address.",
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

    if config is not None:
        read_text(config, "--config")  # unreadable: refused like every file flag
    given = {
        "address": address,
        "metrics_address": metrics_address,
        "grace_period_s": grace_period,
        "log_format": log_format,
        "log_level": log_level,
    }
    overrides = {k: v for k, v in given.items() if v is not None}
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
