"""`inferwire models import SOURCE --name NAME`: a GGUF file or a Hugging Face checkpoint
as a model directory for the embedded engine, or a sentence-transformers folder as an
embedding model's (inferwire/importer, the `import` extra)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
import yaml

from inferwire.cli.app import Command, models_app


@models_app.command("import", cls=Command)
def models_import(
    source: Annotated[
        Path,
        typer.Argument(
            help="A .gguf file, a Hugging Face checkpoint directory, or a sentence-transformers "
            "directory (an embedding model)."
        ),
    ],
    name: Annotated[str, typer.Option("--name", help="The model's name in inferwire.")],
    precision: Annotated[
        str,
        typer.Option(
            help="int4 (the CPU default), fp32, or fp16 (CUDA only); an embedding model: fp32."
        ),
    ] = "",
    execution: Annotated[str, typer.Option(help="cpu or cuda.")] = "cpu",
    out: Annotated[
        Path | None, typer.Option(help="Where the model goes (default: models/NAME).")
    ] = None,
    add_to: Annotated[
        Path | None,
        typer.Option("--add-to", help="A configuration file to add the models entry to."),
    ] = None,
) -> None:
    """Import a model for the embedded engine; print the `models:` entry that serves it."""
    from inferwire.importer.errors import ImportRefusedError
    from inferwire.importer.pipeline import (
        ImportOptions,
        add_to_config,
        missing_packages,
        models_entry,
        run_import,
    )

    if missing := missing_packages():
        typer.echo(
            f"error: models import needs the import extra ({', '.join(missing)} missing): "
            "pip install 'inferwire[import]' (docs/models.md says what it installs)",
            err=True,
        )
        raise typer.Exit(2)
    options = ImportOptions(
        source=source,
        name=name,
        precision=precision,  # "": the source's default (the import decides)
        execution=execution,
        out=out or Path("models") / name,
        command=tuple(sys.argv),
    )
    try:
        imported = run_import(options)
        entry = models_entry(imported, name)
        if add_to is not None and add_to_config(add_to, entry):
            typer.echo(f"import: added model {name!r} to {add_to}", err=True)
    except ImportRefusedError as error:
        typer.echo(f"error: {error}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        typer.echo("error: interrupted; nothing was left half-written", err=True)
        raise typer.Exit(130) from None
    typer.echo(yaml.safe_dump({"models": [entry]}, sort_keys=False), nl=False)
