"""Log set-up: the format follows where standard error goes, unless one is chosen; lines
are formatted and written on the log writer's thread, and none is lost when it stops."""

from __future__ import annotations

import io
import json
import logging
import sys
import threading
from collections.abc import Iterator

import pytest

from inferwire.log import JsonFormatter, TextFormatter, configure_logging, flush_logs


class Terminal(io.StringIO):
    def __init__(self, is_tty: bool) -> None:
        super().__init__()
        self.is_tty = is_tty

    def isatty(self) -> bool:
        return self.is_tty


@pytest.fixture
def saved_root() -> Iterator[logging.Logger]:
    """The root logger, its handlers and level put back afterwards."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield root
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


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
    monkeypatch, saved_root, is_tty, fmt, formatter
):
    monkeypatch.setattr(sys, "stderr", Terminal(is_tty))
    with configure_logging("INFO", fmt) as writer:
        assert type(writer.output.formatter) is formatter


class ThreadOfFormatting:
    """A log argument that notes the thread its text was made on."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __str__(self) -> str:
        self.threads.append(threading.current_thread().name)
        return "formatted"


def test_lines_are_formatted_on_the_writer_thread_not_where_they_are_logged(
    monkeypatch, saved_root
):
    stream = Terminal(False)
    monkeypatch.setattr(sys, "stderr", stream)
    argument = ThreadOfFormatting()
    with configure_logging("INFO", "json"):
        logging.getLogger("inferwire.test").info("value %s", argument, extra={"n": 1})
        flush_logs()
        assert argument.threads and threading.current_thread().name not in argument.threads
        line = json.loads(stream.getvalue())
        assert (line["msg"], line["n"], line["logger"]) == ("value formatted", 1, "inferwire.test")


def test_every_line_is_written_in_order_when_the_writer_stops(monkeypatch, saved_root):
    stream = Terminal(False)
    monkeypatch.setattr(sys, "stderr", stream)
    log = logging.getLogger("inferwire.test")
    with configure_logging("INFO", "json"):
        for n in range(1000):  # more than one batch
            log.info("line", extra={"n": n})
    assert [json.loads(line)["n"] for line in stream.getvalue().splitlines()] == list(range(1000))
    # Stopped: the root logger writes directly again, so a late line is not lost either.
    log.warning("after")
    assert json.loads(stream.getvalue().splitlines()[-1])["msg"] == "after"


def test_levels_below_the_configured_one_are_not_written(monkeypatch, saved_root):
    stream = Terminal(False)
    monkeypatch.setattr(sys, "stderr", stream)
    with configure_logging("warning", "text"):
        logging.getLogger("inferwire.test").info("quiet")
        logging.getLogger("inferwire.test").warning("loud", extra={"model": "demo"})
    assert stream.getvalue() == "warning inferwire.test: loud model=demo\n"
