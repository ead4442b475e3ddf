"""Logging set-up: plain text for a person at a terminal, JSON lines for everything else.

The server writes its log from a thread of its own (`LogWriter`): the code that logs,
the event loop above all, only hands the record to a queue; formatting and writing,
which cost as much as the rest of a small RPC, happen on the writer's thread, which
writes whatever has queued up in one go.
"""

from __future__ import annotations

import atexit
import json
import logging
import logging.handlers
import queue
import sys
import threading
import time
from types import TracebackType
from typing import Any, TextIO

from inferwire.core.threads import name_this_thread

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


class _HandOver(logging.handlers.QueueHandler):
    """Queues the record as it is. The standard `prepare` formats the message in the
    caller, for queues that cross processes; on a thread's queue that is the very work
    the writer exists to take off the caller. What a record carries (its message's
    arguments, its `extra` fields) is therefore formatted a moment later, on the writer."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        return record


class _BatchedStreamHandler(logging.StreamHandler[TextIO]):
    """Formats each record as it comes and writes the lines in batches (`write_pending`):
    one write where a line-buffered stream would make one per line."""

    def __init__(self, stream: TextIO, max_pending: int = 256) -> None:
        super().__init__(stream)
        self._pending: list[str] = []
        self._max_pending = max_pending

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._pending.append(self.format(record) + self.terminator)
        except Exception:
            self.handleError(record)
        if len(self._pending) >= self._max_pending:
            self.write_pending()

    def write_pending(self) -> None:
        with self.lock:  # type: ignore[union-attr]
            if not self._pending:
                return
            text, self._pending = "".join(self._pending), []
            try:
                self.stream.write(text)
                self.stream.flush()
            except Exception:
                self.handleError(logging.makeLogRecord({"msg": text}))

    def flush(self) -> None:
        self.write_pending()

    def write_each_line(self) -> None:
        """No more batches: with no writer thread to write them, each line goes at once."""
        self._max_pending = 1
        self.write_pending()


# How long the writer sleeps when it has emptied the queue while lines keep coming: the most
# a line waits to be written under load.
BUSY_POLL_S = 0.01


class _Flushed(threading.Event):
    """Put on the queue by `LogWriter.flush`: set once what was queued before it is written."""


class LogWriter(logging.handlers.QueueListener):
    """The thread that formats and writes the log (see the module's docstring).

    `configure_logging` starts it; `stop()` (or leaving its `with`) writes every line
    still queued, then puts the handler back in the root logger so that lines logged
    afterwards are written directly.
    """

    def __init__(self, handler: _BatchedStreamHandler) -> None:
        self.records: queue.SimpleQueue[Any] = queue.SimpleQueue()
        super().__init__(self.records, handler)
        self.output = handler
        self.hand_over = _HandOver(self.records)
        self._named = False
        self._busy = False  # a record came since the writer last found the queue empty

    def dequeue(self, block: bool) -> Any:
        if not self._named:
            name_this_thread("log")
            self._named = True
        while True:
            try:
                record = self.records.get_nowait()
            except queue.Empty:
                self.output.write_pending()  # nothing more to batch: write before waiting
                if not self._busy:
                    return self.records.get()  # idle: the next record wakes this thread
                # Busy: sleep rather than wait. A record queued for a waiting thread
                # wakes it, a cost the logging thread pays on every line; queued while
                # this one sleeps, records wake nothing and are written in one batch.
                self._busy = False
                time.sleep(BUSY_POLL_S)
                continue
            self._busy = True
            return record

    def handle(self, record: Any) -> None:
        if isinstance(record, _Flushed):
            self.output.write_pending()
            record.set()
            return
        super().handle(record)

    def flush(self, timeout_s: float = 5.0) -> None:
        """Wait (up to `timeout_s`) until every line queued so far is written."""
        if self._thread is None:
            return
        flushed = _Flushed()
        self.records.put_nowait(flushed)
        flushed.wait(timeout_s)

    def stop(self) -> None:
        if self._thread is None:  # not running, or stopped already
            return
        root = logging.getLogger()
        if self.hand_over in root.handlers:
            root.handlers[root.handlers.index(self.hand_over)] = self.output
        super().stop()  # the thread writes what was queued, up to the sentinel
        self.output.write_each_line()

    def __enter__(self) -> LogWriter:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        self.stop()


_writer: LogWriter | None = None


def configure_logging(level: str = "INFO", fmt: str = "auto") -> LogWriter:
    """Log to stderr through a started `LogWriter`, which it returns (stop it, or use it in a
    `with`, to write every line before the process exits; at the latest it is stopped at
    exit). `auto` is text when stderr is a terminal and JSON lines otherwise."""
    global _writer
    if _writer is not None:
        _writer.stop()
    if fmt == "auto":
        fmt = "text" if sys.stderr.isatty() else "json"
    # Neither formatter prints a record's thread, process or process name; each costs a
    # call (`current_thread`, `getpid`, a look into multiprocessing) on every record, made
    # on the thread that logs: for the access line, the event loop.
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    handler = _BatchedStreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    _writer = LogWriter(handler)
    root = logging.getLogger()
    root.handlers[:] = [_writer.hand_over]
    root.setLevel(level.upper())
    _writer.start()
    return _writer


def flush_logs() -> None:
    """Wait until the log writer has written every line logged so far (if one runs)."""
    if _writer is not None:
        _writer.flush()


@atexit.register
def _stop_writer() -> None:
    # atexit runs this before logging's own shutdown (registered earlier, run later).
    if _writer is not None:
        _writer.stop()
