"""The engine process (`engine_process: true`): the engine path's step loop, run by
`engine_process.EngineProcess` as `python -m inferwire.backends.ort_genai.engine_host FD SPEC`.

Why a process: in the server's process, `og.Engine.run` takes the GIL back after each
step, so every step waits for whatever Python the event loop is running, and a busy Python
thread beside it costs the step 10-18% more CPU (the bench notebook, 3 December). Here the
step loop (engine.py, unchanged) has an interpreter to itself; its rows' items leave
through the socket `FD` instead of reaching an event loop, one message per hand-over
(`stream_interval_ms`), and the server sends commands back: start, taken, stop, close.

A reader thread takes commands; the step loop's own thread steps the engine and writes.
The process ends with the step loop's thread: status 0 once closed, 3 if it failed (its
requests were failed first, and the server reports the status). A closed socket (the
server gone) ends it at once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pickle
import signal
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from inferwire.backends.ort_genai.engine import EngineSettings, EngineStepLoop
from inferwire.backends.ort_genai.model import load_model, read_config
from inferwire.backends.threaded.consumer import StreamEvent, TokenTally
from inferwire.backends.threaded.delivery import Outbox
from inferwire.backends.threaded.shared_thread import (
    Delivery,
    Handover,
    Released,
    SharedThreadRequest,
    deliver,
)
from inferwire.core.results import GenerationEnd, TextDelta
from inferwire.core.tracing import NO_TRACER, Tracer

# What one item of a message from this process is: (row id, kind, value, extra).
DELTA, END, ERROR, RELEASED, FIRST_TOKEN, AFTER_CANCEL = range(6)
Item = tuple[int, int, Any, Any]
STEP_LOOP_FAILED = 3  # the exit status when the step loop's thread stopped on an error


class PipeOutbox(Outbox[Delivery]):
    """The step loop's outbox: each hand-over is one message on the socket."""

    def __init__(self, connection: Connection, interval_s: float) -> None:
        super().__init__(deliver, interval_s)  # `deliver` is never called here
        self._connection = connection
        self._ids: dict[SharedThreadRequest, int] = {}
        self._rows: dict[int, SharedThreadRequest] = {}
        self._notes: list[Item] = []  # progress, ahead of the next items

    def register(self, row_id: int, row: SharedThreadRequest) -> None:
        self._ids[row], self._rows[row_id] = row_id, row

    def row(self, row_id: int) -> SharedThreadRequest | None:
        return self._rows.get(row_id)

    def note(self, row_id: int, kind: int, value: float | int) -> None:
        """Progress the server's record needs (step loop thread); goes at the next flush."""
        self._notes.append((row_id, kind, value, None))
        self._urgent = True

    def hand_over(self, collected: dict[asyncio.AbstractEventLoop, list[Delivery]]) -> None:
        message, self._notes = self._notes, []
        for items in collected.values():
            for row, item in items:
                row_id = self._ids[row]
                message.append(_encode(row_id, row, item))
                if isinstance(item, Released):
                    del self._ids[row], self._rows[row_id]
        self._connection.send_bytes(pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL))


def _encode(row_id: int, row: SharedThreadRequest, item: StreamEvent | Released) -> Item:
    if isinstance(item, TextDelta):
        return (row_id, DELTA, item.text, item.completion_tokens)
    if isinstance(item, GenerationEnd):
        counts = (item.usage.prompt_tokens, item.usage.completion_tokens)
        return (row_id, END, item.finish_reason.value, counts)
    if isinstance(item, Released):
        return (row_id, RELEASED, row.tally.generated, None)
    return (row_id, ERROR, str(item) or type(item).__name__, None)


class _NotedProgress:
    """A row's `GenerationProgress` here: what the server's record needs is noted for it."""

    tracer: Tracer = NO_TRACER

    def __init__(self, outbox: PipeOutbox, row_id: int) -> None:
        self._outbox, self._row_id = outbox, row_id

    def first_token(self, at: float | None = None) -> None:
        # perf_counter is CLOCK_MONOTONIC, the same clock in the server's process.
        self._outbox.note(self._row_id, FIRST_TOKEN, time.perf_counter() if at is None else at)

    def generated_after_cancel(self, count: int = 1) -> None:
        self._outbox.note(self._row_id, AFTER_CANCEL, count)

    def counted(
        self, prompt_tokens: int | None = None, completion_tokens: int | None = None
    ) -> None:
        """The server counts these from the items (engine_process.py)."""


def _serve(connection: Connection, step_loop: EngineStepLoop, outbox: PipeOutbox) -> None:
    # The rows' items leave through the socket: this loop never runs, it only keys them.
    unused_loop = asyncio.new_event_loop()
    while True:
        try:
            command = pickle.loads(connection.recv_bytes())
        except (EOFError, OSError):
            os._exit(0)  # the server is gone: nobody is left to answer
        kind = command[0]
        if kind == "start":
            _, row_id, prepared = command
            tally = TokenTally(_NotedProgress(outbox, row_id), len(prepared.prompt_ids))
            started = step_loop.new_row(prepared, tally, unused_loop)
            outbox.register(row_id, started)
            started.start()
        elif kind == "close":
            step_loop.close()
        elif (row := outbox.row(command[1])) is None:
            continue  # released meanwhile
        elif kind == "taken":
            row.taken(command[2])
        elif kind == "stop":
            row.stop()


def main(argv: list[str]) -> int:
    # The server decides when this process ends, after draining its streams: a Ctrl-C
    # reaches the whole process group, and systemd's stop sends SIGTERM to every process
    # of the unit. The closed socket of a server that is gone ends it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    connection = Connection(int(argv[0]))
    spec = json.loads(argv[1])
    # Plain lines on the server's stderr at the server's level (backends do not reach the
    # server's log writer, inferwire/log.py).
    logging.basicConfig(
        level=spec["log_level"], format="engine process %(levelname)s %(name)s: %(message)s"
    )
    try:
        path = Path(spec["path"])
        config = read_config(path, spec["device"])
        model = load_model(path, config, spec["device"], spec["static_batch_size"])
        settings = EngineSettings(**spec["settings"])
        outbox = PipeOutbox(connection, settings.stream_interval_s)
        step_loop = EngineStepLoop(model, settings, Handover(settings.stream_interval_s, outbox))
    except Exception as exc:
        connection.send(("failed", f"{type(exc).__name__}: {exc}"))
        return 1
    connection.send(("ready", step_loop.dynamic, step_loop.max_batch_size, step_loop.step_width))
    threading.Thread(target=_serve, args=(connection, step_loop, outbox), daemon=True).start()
    step_loop.wait()
    return 0 if step_loop.failure is None else STEP_LOOP_FAILED
