"""Marks every test with its tier, taken from its folder (see pyproject's markers).

`pytest -m unit` (or `make check`) runs only the quick tier; the folders are the tiers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TIERS = ("unit", "engine", "triton", "polyglot")
TESTS = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        tier = item.path.relative_to(TESTS).parts[0]
        if tier in TIERS:
            item.add_marker(getattr(pytest.mark, tier))
