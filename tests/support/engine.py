"""The in-process server that the engine tier shares, and what its tests read back.

It serves the bundled model under several names so that tests which unload,
saturate or break a model do not disturb each other:
  demo   - loaded at start-up; the model most tests use
  tight  - loaded at start-up; max_concurrency 1, max_queue 1 (queue tests)
  spare  - configured, not loaded at start-up (lifecycle and health tests)
  broken - points at a directory that does not exist (failed loads)
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from inferwire.backends.ort_genai import builtin_model_path
from inferwire.config import Settings, load_settings
from inferwire.server import InferwireServer
from inferwire.v1 import inference_pb2_grpc

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


def demo_model_variant(
    folder: Path, config_file: str, edit: Callable[[dict[str, Any]], None]
) -> Path:
    """The bundled model in `folder`, its files linked, but for the JSON file `config_file`
    (genai_config.json, tokenizer_config.json), written with `edit` applied; no model card."""
    for source in builtin_model_path().iterdir():
        if source.name == config_file:
            config = json.loads(source.read_text())
            edit(config)
            (folder / source.name).write_text(json.dumps(config))
        elif source.is_file() and source.suffix != ".md":
            (folder / source.name).symlink_to(source)
    return folder


@contextlib.asynccontextmanager
async def serving(
    settings: Settings, grace_s: float = 1
) -> AsyncIterator[inference_pb2_grpc.InferenceServiceStub]:
    """An in-process server for `settings`, and a stub on a channel to it."""
    server = InferwireServer(settings)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.port}") as channel:
            yield inference_pb2_grpc.InferenceServiceStub(channel)
    finally:
        await server.stop(grace_s=grace_s)
