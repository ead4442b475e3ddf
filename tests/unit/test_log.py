"""Log set-up: the format follows where standard error goes, unless one is chosen."""

from __future__ import annotations

import logging
import sys

import pytest

from inferwire.log import JsonFormatter, TextFormatter, configure_logging


class Terminal:
    def __init__(self, is_tty: bool) -> None:
        self.is_tty = is_tty

    def isatty(self) -> bool:
        return self.is_tty

    def write(self, text: str) -> int:
        return len(text)


@pytest.mark.parametrize(
    ("is_tty", "fmt", "formatter"),
    [
        (True, "auto", TextFormatter),
        (False, "auto", JsonFormatter),
        (True, "json", JsonFormatter),
        (False, "text", TextFormatter),
    ],
)
def test_logs_are_text_on_a_terminal_and_json_otherwise_unless_chosen(
    monkeypatch, is_tty, fmt, formatter
):
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    monkeypatch.setattr(sys, "stderr", Terminal(is_tty))
    try:
        configure_logging("INFO", fmt)
        assert type(root.handlers[0].formatter) is formatter
    finally:
        root.handlers[:], _ = saved
        root.setLevel(saved[1])
