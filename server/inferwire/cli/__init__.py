"""The `inferwire` command line: run the server (`serve`), talk to one (`infer`,
`tokenize`, `health`, `models`), and make bearer tokens (`token`).

Each command group lives in a module of its own and adds itself to `app` on import,
so the modules are imported in the order the help lists their commands.
"""

from __future__ import annotations

from inferwire.cli import serve  # noqa: F401

# isort: split
from inferwire.cli import client, importing, models, tokens  # noqa: F401
from inferwire.cli.app import app


def main() -> None:
    app()
