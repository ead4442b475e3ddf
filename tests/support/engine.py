"""The in-process server that the engine tier shares, and what its tests read back.

It serves the bundled model under several names so that tests which unload,
saturate or break a model do not disturb each other:
  demo   - loaded at start-up; the model most tests use
  tight  - loaded at start-up; max_concurrency 1, max_queue 1 (queue tests)
  spare  - configured, not loaded at start-up (lifecycle and health tests)
  broken - points at a directory that does not exist (failed loads)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import pytest

from inferwire.config import Settings, load_settings

MAX_PROMPT_BYTES = 4096

# A client whose HTTP/2 receive window is tiny: when it stops reading, the
# server's writes block, and so does generation. This holds a stream (and its
# concurrency slot) open deterministically, without relying on timing.
SLOW_READER_OPTIONS = [("grpc.http2.lookahead_bytes", 1024), ("grpc.http2.bdp_probe", 0)]


def make_settings() -> Settings:
    builtin = {"path": "builtin", "device": "cpu"}
    return load_settings(
        server={
            "address": "127.0.0.1:0",
            "max_prompt_bytes": MAX_PROMPT_BYTES,
            "max_receive_message_bytes": 64 * 1024,
            "health_check_interval_s": 0.5,
            "grace_period_s": 5,
        },
        models=[
            {"name": "demo", "load_on_startup": True, "options": builtin},
            {
                "name": "tight",
                "load_on_startup": True,
                "max_concurrency": 1,
                "max_queue": 1,
                "options": builtin,
            },
            {"name": "spare", "options": builtin},
            {"name": "broken", "options": {"path": "/nonexistent/inferwire-model"}},
        ],
    )


@dataclass
class RequestLogRecords:
    """Reads the server's structured `request finished` log records."""

    caplog: pytest.LogCaptureFixture

    def for_request(self, request_id: str) -> logging.LogRecord | None:
        for record in self.caplog.records:
            if record.name == "inferwire.access" and getattr(record, "request_id", None) == (
                request_id
            ):
                return record
        return None
