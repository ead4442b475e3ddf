"""Stream output: each response's text as the delta since the previous response."""

from __future__ import annotations

import logging

from inferwire.backends.triton.options import StreamMode

log = logging.getLogger(__package__)


class DeltaTracker:
    """Turns each response's text into the delta since the previous response.

    In auto mode the second non-empty response decides: one that extends the text so
    far is taken as cumulative. A later response that contradicts the decision switches
    to deltas.
    """

    def __init__(self, mode: StreamMode) -> None:
        self.mode: StreamMode = mode
        self._text = ""

    def feed(self, text: str) -> str:
        if not text:
            return ""
        if self.mode == "auto":
            if not self._text:
                self._text = text
                return text
            self.mode = "cumulative" if text.startswith(self._text) else "delta"
        if self.mode == "cumulative":
            if text.startswith(self._text):
                delta, self._text = text[len(self._text) :], text
                return delta
            log.warning("a cumulative stream rewrote its text; treating responses as deltas")
            self.mode = "delta"
        self._text += text
        return text
