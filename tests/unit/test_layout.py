"""The package's shape, pinned: two doors (api/, http/) that never import each other, the
edge, the house's metrics and the core beneath them, the command line (cli/) above them
all and imported by nothing, config.py and log.py beneath the doors, imports that only
point down, and every hand-written module short enough to read in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "inferwire"
MAX_LINES = 450
# What each layer may import of inferwire (besides itself): a folder, or a top module
# (`config`: config.py). config.py is settings, a leaf on the core's settings types and
# model_config.py (the models' entries; the CLI hands it the backend lookup that checks
# their options); log.py is the logging set-up; cli/ is the `inferwire` command, which
# nothing else imports.
ALLOWED = {
    "wire": set(),
    "core": set(),
    "backends": {"core", "wire", "addresses"},
    "edge": {"core", "config", "addresses"},
    "metrics": {"core", "addresses"},
    "kv_events": {"core"},  # KV events' sockets (server.kv_events)
    "api": {"core", "edge", "metrics", "wire", "v1", "config", "log", "addresses", "__init__"},
    "http": {"core", "edge", "metrics", "config", "addresses", "__init__"},
    # The importer needs the `import` extra: only the CLI's `models import` imports it. It
    # measures a built model's load on the backend's CPU path (importer/measure.py).
    "importer": {"backends", "core"},
    "config": {"core", "model_config", "addresses"},
    "model_config": {"core"},
    "log": {"core"},
    "cli": {"core", "v1", "config", "log", "server", "backends", "importer", "__init__"},
}


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "v1" not in p.relative_to(PACKAGE).parts)


def imported(path: Path) -> set[str]:
    """The inferwire subpackages (or top modules) `path` imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            parts = node.module.split(".")
            if parts[0] == "inferwire":
                names.add(parts[1] if len(parts) > 1 else "__init__")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "inferwire":
                    names.add(parts[1] if len(parts) > 1 else "__init__")
    return names


def layer_modules(layer: str) -> list[Path]:
    """A folder's modules, or the top module `layer`.py."""
    if (PACKAGE / layer).is_dir():
        return sorted((PACKAGE / layer).rglob("*.py"))
    return [PACKAGE / f"{layer}.py"]


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_what_is_below_it(layer):
    wrong = {}
    for path in layer_modules(layer):
        if "v1" in path.relative_to(PACKAGE).parts:
            continue
        bad = imported(path) - ALLOWED[layer] - {layer}
        if bad:
            wrong[str(path.relative_to(PACKAGE))] = sorted(bad)
    assert wrong == {}


def test_the_http_door_never_imports_grpc():
    for path in (PACKAGE / "http").rglob("*.py"):
        tree = ast.parse(path.read_text())
        modules_used = {
            alias.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import)
            for alias in n.names
        } | {
            n.module.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module
        }
        assert "grpc" not in modules_used, path


def test_only_the_cli_imports_the_importer():
    users = {
        str(path.relative_to(PACKAGE))
        for path in modules()
        if "importer" in imported(path) and path.relative_to(PACKAGE).parts[0] != "importer"
    }
    assert users == {"cli/importing.py"}


def test_nothing_but_the_cli_imports_the_cli():
    users = {
        str(path.relative_to(PACKAGE))
        for path in modules()
        if "cli" in imported(path) and path.relative_to(PACKAGE).parts[0] != "cli"
    }
    assert users == set()


def test_every_hand_written_module_is_short_enough_to_read_in_one_sitting():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
