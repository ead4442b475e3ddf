"""A model's inference statistics since the server started (KServe's ModelStatistics)."""

from __future__ import annotations

import time

from inferwire.core.record import Outcome, RequestRecord
from inferwire.core.status import Durations, InferenceStatistics

_KINDS = ("succeeded", "failed", "queued", "computed")
_FINISHED = (Outcome.STOP, Outcome.STOP_SEQUENCE, Outcome.LENGTH)


class RequestStatistics:
    """Ended requests by kind: how many, and the seconds they took together."""

    def __init__(self, model: str) -> None:
        self._model = model
        self._durations = {kind: [0, 0.0] for kind in _KINDS}  # [count, total seconds]
        self._last_ended_unix_ms = 0

    def ended(self, record: RequestRecord) -> None:
        elapsed = (record.ended or time.perf_counter()) - record.arrived
        finished = record.outcome in _FINISHED
        kinds = [("succeeded" if finished else "failed", elapsed)]
        if record.admitted is not None:
            kinds += [("queued", record.queue_s), ("computed", elapsed - record.queue_s)]
        for kind, seconds in kinds:
            entry = self._durations[kind]
            entry[0] += 1
            entry[1] += seconds
        self._last_ended_unix_ms = int(time.time() * 1e3)

    def report(self) -> InferenceStatistics:
        durations = {kind: Durations(int(c), float(s)) for kind, (c, s) in self._durations.items()}
        return InferenceStatistics(
            name=self._model, **durations, last_inference_unix_ms=self._last_ended_unix_ms
        )
