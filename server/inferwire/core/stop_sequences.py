"""Stop-sequence matching over a stream of text deltas."""

from __future__ import annotations

from collections.abc import Callable

from inferwire.core.results import TokenLogprob


class StopSequenceMatcher:
    """Finds stop strings in streamed text without ever emitting text it must retract.

    Text that could be the start of a stop string is held back until the next
    delta decides it, so the emitted pieces always concatenate to the final text.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""
        self.matched = ""  # the stop string found (the earliest; the first given at a tie)

    def feed(self, text: str) -> tuple[str, bool]:
        """Add a delta; return (text safe to emit, whether a stop string matched).

        On a match the returned text ends just before the earliest stop string.
        """
        if not self._stops:
            return text, False
        buffer = self._pending + text
        hits = [(at, stop) for stop in self._stops if (at := buffer.find(stop)) >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            self._pending = ""
            return buffer[:at], True
        held = self._longest_partial_stop_suffix(buffer)
        self._pending = buffer[len(buffer) - held :] if held else ""
        return buffer[: len(buffer) - held], False

    def flush(self) -> str:
        """Release held-back text once the stream ends without a match."""
        pending, self._pending = self._pending, ""
        return pending

    def _longest_partial_stop_suffix(self, buffer: str) -> int:
        longest = 0
        for stop in self._stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest


class HeldLogprobs:
    """Keeps each delta's token log-probabilities with its text while stop matching holds or
    cuts that text.

    Offsets count characters of the backend's text. A delta's entries go out with the
    message that emits the last character of that delta's text, never before their text.
    On a stop-string cut at offset `cut`, a delta whose text starts before the cut keeps
    its entries (a token straddling the cut contributed text to the output, so it stays);
    one whose text starts at or after the cut is dropped with its text.
    """

    def __init__(self) -> None:
        self._received = 0
        self._pending: list[tuple[int, int, tuple[TokenLogprob, ...]]] = []

    def add(self, text: str, logprobs: tuple[TokenLogprob, ...]) -> None:
        """Record the next delta from the backend."""
        start = self._received
        self._received += len(text)
        if logprobs:
            self._pending.append((start, self._received, logprobs))

    def release(self, emitted: int) -> tuple[TokenLogprob, ...]:
        """Entries whose text is now wholly out, `emitted` characters having been emitted."""
        return self._take(lambda start, end: end <= emitted)

    def cut(self, emitted: int) -> tuple[TokenLogprob, ...]:
        """Entries to send with the text ending at the stop string (which starts at `emitted`)."""
        kept = self._take(lambda start, end: start < emitted)
        self._pending.clear()
        return kept

    def flush(self) -> tuple[TokenLogprob, ...]:
        """Every remaining entry, once the stream ends without a match."""
        return self._take(lambda start, end: True)

    def _take(self, ready: Callable[[int, int], bool]) -> tuple[TokenLogprob, ...]:
        taken: list[TokenLogprob] = []
        while self._pending and ready(self._pending[0][0], self._pending[0][1]):
            taken.extend(self._pending.pop(0)[2])
        return tuple(taken)
