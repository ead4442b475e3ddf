"""What an import says on standard error: a line a stage, and a bar where it has a count.

On a terminal the bar redraws in place; elsewhere (a log, CI) it writes its line when the
stage starts and when it ends, so a log stays short.
"""

from __future__ import annotations

import sys
import time
from types import TracebackType

_WIDTH = 30


def say(message: str) -> None:
    print(f"import: {message}", file=sys.stderr, flush=True)


def _size(amount: float, unit: str) -> str:
    if unit != "B":
        return f"{amount:.0f}"
    for name in ("B", "KiB", "MiB", "GiB"):
        if amount < 1024 or name == "GiB":
            return f"{amount:.1f} {name}" if name != "B" else f"{amount:.0f} B"
        amount /= 1024
    return f"{amount:.1f} GiB"


class Progress:
    """`with Progress(label, total) as bar: bar.advance(n)`; total None: a spinner of
    elapsed time (`tick`)."""

    def __init__(self, label: str, total: int | None, unit: str = "") -> None:
        self.label, self.total, self.unit = label, total, unit
        self.done = 0
        self._terminal = sys.stderr.isatty()
        self._started = time.monotonic()
        self._drawn = 0.0

    def __enter__(self) -> Progress:
        if not self._terminal:
            say(f"{self.label}...")
        self._draw(force=True)
        return self

    def advance(self, amount: int = 1) -> None:
        self.set(self.done + amount)

    def set(self, done: int) -> None:
        self.done = done
        self._draw()

    def tick(self) -> None:
        self._draw()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self._terminal or (not force and now - self._drawn < 0.1):
            return
        self._drawn = now
        elapsed = f"{now - self._started:.0f} s"
        if self.total:
            filled = int(_WIDTH * min(self.done, self.total) / self.total)
            bar = "#" * filled + "-" * (_WIDTH - filled)
            count = f"{_size(self.done, self.unit)} / {_size(self.total, self.unit)}"
            line = f"import: {self.label} [{bar}] {count} {elapsed}"
        else:
            line = f"import: {self.label}: {elapsed}"
        sys.stderr.write("\r" + line[:160])
        sys.stderr.flush()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        elapsed = time.monotonic() - self._started
        if self._terminal:
            self._draw(force=True)
            sys.stderr.write("\n")
        if kind is None:
            say(f"{self.label}: done in {elapsed:.1f} s")
