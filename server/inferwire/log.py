"""Logging set-up: plain text for a person at a terminal, JSON lines for everything else."""

from __future__ import annotations

import json
import logging
import sys
import time

# Attributes every LogRecord has; anything else came from `extra=` and is a field.
_STANDARD_ATTRS = set(logging.makeLogRecord({}).__dict__) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    # What json.dumps(entry, default=str) builds on every call, built once.
    _encoder = json.JSONEncoder(default=str)

    def __init__(self) -> None:
        super().__init__()
        # The timestamp down to the second, formatted once per second rather than per line.
        self._second = -1
        self._second_text = ""

    def _timestamp(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second:
            self._second_text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = second
        return f"{self._second_text}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": self._timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        entry.update({k: v for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return self._encoder.encode(entry)


class TextFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(
            f"{k}={v}" for k, v in record.__dict__.items() if k not in _STANDARD_ATTRS
        )
        line = f"{record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if fields:
            line += f" {fields}"
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: str = "INFO", fmt: str = "auto") -> None:
    """Log to stderr; `auto` is text when stderr is a terminal and JSON lines otherwise."""
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
