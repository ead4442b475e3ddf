"""Stop-sequence matching over a stream of text deltas."""

from __future__ import annotations


class StopSequenceMatcher:
    """Finds stop strings in streamed text without ever emitting text it must retract.

    Text that could be the start of a stop string is held back until the next
    delta decides it, so the emitted pieces always concatenate to the final text.
    """

    def __init__(self, stops: tuple[str, ...]) -> None:
        self._stops = tuple(s for s in stops if s)
        self._pending = ""

    def feed(self, text: str) -> tuple[str, bool]:
        """Add a delta; return (text safe to emit, whether a stop string matched).

        On a match the returned text ends just before the earliest stop string.
        """
        if not self._stops:
            return text, False
        buffer = self._pending + text
        hits = [i for i in (buffer.find(s) for s in self._stops) if i >= 0]
        if hits:
            self._pending = ""
            return buffer[: min(hits)], True
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
