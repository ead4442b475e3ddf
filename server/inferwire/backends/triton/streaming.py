"""Reading responses: each one's text as the delta since the previous one, its counts and
its log-probabilities."""

from __future__ import annotations

import logging
from collections.abc import Set

from tritonclient.grpc import InferResult, service_pb2

from inferwire.backends.triton.logprobs import response_logprobs
from inferwire.backends.triton.options import StreamMode
from inferwire.backends.triton.tensors import (
    ReportedCounts,
    absorb_counts,
    first_text,
    raw_first_text,
)
from inferwire.core.backend import GenerationProgress
from inferwire.core.requests import GenerationRequest
from inferwire.core.results import TextDelta, TokenLogprob
from inferwire.wire.oip import FINISH_REASON, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS, TEXT_OUTPUT

log = logging.getLogger(__package__)

# Outputs that carry a finish reason or token counts (tensors.absorb_counts).
COUNT_OUTPUTS = frozenset({FINISH_REASON, NUM_INPUT_TOKENS, NUM_OUTPUT_TOKENS})


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


class ResponseReader:
    """One request's responses, read in turn into events.

    The text is read from the raw output bytes; tritonclient's InferResult (numpy arrays)
    only for a model with count outputs or a request for log-probabilities.
    """

    def __init__(
        self, tracker: DeltaTracker, request: GenerationRequest, outputs: Set[str]
    ) -> None:
        self.tracker = tracker
        self.request = request
        self.counts = not COUNT_OUTPUTS.isdisjoint(outputs)
        self.reported = ReportedCounts()
        self.text: list[str] = []  # the deltas passed on, for a tokenizer's count
        # Log-probabilities of tokens whose text has not been passed on yet.
        self.pending: list[TokenLogprob] = []

    def delta(
        self, response: service_pb2.ModelInferResponse, progress: GenerationProgress
    ) -> TextDelta | None:
        """The event for one response: its new text and log-probabilities; None for none."""
        if not response.outputs:
            return None  # e.g. the empty final response
        params = self.request.params
        if self.counts or params.logprobs:
            result = InferResult(response)
            absorb_counts(result, self.reported)
            if params.logprobs:
                self.pending.extend(response_logprobs(result, params.top_logprobs))
        text = raw_first_text(response, TEXT_OUTPUT)
        if text is None:
            text = first_text(InferResult(response).as_numpy(TEXT_OUTPUT))
        delta = self.tracker.feed(text)
        if not delta:
            return None
        progress.first_token()
        self.text.append(delta)
        event = TextDelta(delta, self.reported.completion_tokens, tuple(self.pending))
        self.pending.clear()
        return event
