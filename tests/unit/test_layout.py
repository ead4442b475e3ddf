"""The package's shape, pinned: two doors (api/, http/) that never import each other, the
edge, the house's metrics and the core beneath them, imports that only point down, and
every hand-written module short enough to read in one sitting."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "server" / "inferwire"
MAX_LINES = 450
# What each layer may import of inferwire (besides itself). config.py is settings, and a
# leaf apart from the backend registry it checks model options against.
ALLOWED = {
    "wire": set(),
    "core": set(),
    "backends": {"core", "wire", "addresses"},
    "edge": {"core", "config", "addresses"},
    "metrics": {"core", "addresses"},
    "api": {"core", "edge", "metrics", "wire", "v1", "config", "log", "addresses", "__init__"},
    "http": {"core", "edge", "metrics", "config", "addresses", "__init__"},
    # The importer needs the `import` extra: only the CLI's `models import` imports it.
    "importer": set(),
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


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_imports_only_what_is_below_it(layer):
    wrong = {}
    for path in (PACKAGE / layer).rglob("*.py"):
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


def test_every_hand_written_module_is_short_enough_to_read_in_one_sitting():
    long = {
        str(p.relative_to(PACKAGE)): n
        for p in modules()
        if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    assert long == {}
