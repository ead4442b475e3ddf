"""The engine path with its scheduler in a process of its own (`engine_process: true`).

`EngineProcess` stands where `EngineScheduler` stands in the backend (the same `stream`,
`serves`, `close`, `alive`): it starts engine_host.py with one end of a socket pair, sends
each request's commands (start with the prepared request, taken, stop) as small pickled
tuples, and a reader thread turns the host's messages (one per hand-over) into each
request's items on its event loop, through a `delivery.Outbox` as the in-process path does.

The price: the host loads the model again (its weights count twice in the memory
estimate), and a request's items cross a socket. If the host dies, every request on it
ends with an error naming how it ended, and health reports it; the per-request path, which
runs in this process, goes on serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import pickle
import signal
import socket
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from inferwire.backends.ort_genai import engine_host as host
from inferwire.backends.ort_genai.engine import EngineSettings, engine_serves
from inferwire.backends.ort_genai.sampling import PreparedRequest
from inferwire.backends.threaded.consumer import Channel, StreamEvent, TokenTally, consume
from inferwire.backends.threaded.delivery import Outbox
from inferwire.backends.threaded.shared_thread import RESUME_AT
from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.errors import BackendUnavailableError
from inferwire.core.threads import name_this_thread
from inferwire.core.types import FinishReason, GenerationEnd, GenerationParams, TextDelta, Usage

log = logging.getLogger(__name__)

# Deltas a consumer takes before the host is told: the host sets a row aside at
# BUFFERED_DELTAS unread and resumes it at RESUME_AT, so what it is not told must stay
# under RESUME_AT for a caught-up consumer to resume it.
_TAKEN_EVERY = RESUME_AT // 2
_START_TIMEOUT_S = 600.0  # loading a large model on a slow disk
_HOST_MAIN = f"import sys; from {host.__name__} import main; sys.exit(main(sys.argv[1:]))"


@dataclass(frozen=True)
class _Progress:
    """A first token (`at`, perf_counter) or tokens made after the consumer left."""

    kind: int
    value: float | int


@dataclass(frozen=True)
class _Released:
    generated: int


_Item = StreamEvent | _Progress | _Released


@dataclass(eq=False)
class _RemoteRow:
    """One request on the host; its consumer's `Producer`."""

    row_id: int
    prepared: PreparedRequest
    tally: TokenTally
    channel: Channel
    released: asyncio.Future[None]
    engine: EngineProcess
    untold: int = 0  # deltas taken that the host was not told of

    def start(self) -> asyncio.Future[None]:
        self.engine.submit(self)
        return self.released

    def taken(self, deltas: int) -> None:
        self.untold += deltas
        if self.untold >= _TAKEN_EVERY:
            self.engine.send(("taken", self.row_id, self.untold))
            self.untold = 0

    def stop(self) -> None:
        self.engine.send(("stop", self.row_id))


class EngineProcess:
    """The engine path, its scheduler in engine_host.py's process."""

    def __init__(
        self, path: Path, device: str, static_batch_size: int | None, settings: EngineSettings
    ) -> None:
        spec = {
            "path": str(path),
            "device": device,
            "static_batch_size": static_batch_size,
            "settings": asdict(settings),
        }
        ours, theirs = socket.socketpair()
        self._process = subprocess.Popen(
            [sys.executable, "-c", _HOST_MAIN, str(theirs.fileno()), json.dumps(spec)],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,  # stdout may carry the server's own output
        )
        theirs.close()
        self.pid = self._process.pid
        self._name = settings.name
        self._connection = Connection(ours.detach())
        self._lock = threading.Lock()  # the rows, the exit, and writes to the socket
        self._rows: dict[int, _RemoteRow] = {}
        self._ids = itertools.count()
        self._exited = False
        self._closing = False
        self.failure: BaseException | None = None
        self._outbox: Outbox[tuple[_RemoteRow, _Item]] = Outbox(_deliver, 0.0)
        try:
            hello = self._await_ready()
        except BaseException:
            self._process.kill()
            self._process.wait()
            raise
        self.dynamic, self.max_batch_size, self.step_width = hello
        self._reader = threading.Thread(
            target=self._read, name=f"engine-pipe-{settings.name}", daemon=True
        )
        self._reader.start()

    def _await_ready(self) -> tuple[bool, int, int]:
        if not self._connection.poll(_START_TIMEOUT_S):
            raise RuntimeError(f"the engine process did not start in {_START_TIMEOUT_S:.0f} s")
        try:
            reply = self._connection.recv()
        except EOFError:
            code = self._process.wait()
            raise RuntimeError(f"the engine process {_exit_description(code)}") from None
        if reply[0] != "ready":
            raise RuntimeError(f"the engine process could not start: {reply[1]}")
        return bool(reply[1]), int(reply[2]), int(reply[3])

    @property
    def alive(self) -> bool:
        return not self._exited and self._process.poll() is None

    def close(self) -> None:
        """End the process; called once no request is in flight."""
        self._closing = True
        self.send(("close",))
        try:
            self._process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.error("the engine process did not end; killing it", extra={"pid": self.pid})
            self._process.kill()
            self._process.wait()
        self._reader.join()
        self._connection.close()

    # ---- the event-loop side --------------------------------------------

    def serves(self, params: GenerationParams, reserved: bool = False) -> bool:
        return engine_serves(self.dynamic, params, reserved)

    def stream(self, request: PreparedRequest, progress: GenerationProgress) -> GenerationEvents:
        """Run one request on the engine process: its deltas, then its end."""
        loop = asyncio.get_running_loop()
        row = _RemoteRow(
            row_id=next(self._ids),
            prepared=request,
            tally=TokenTally(progress, len(request.prompt_ids)),
            channel=Channel(loop),
            released=loop.create_future(),
            engine=self,
        )
        return consume(row.channel, row, row.tally, request.coalesce)

    def submit(self, row: _RemoteRow) -> None:
        with self._lock:
            if self._exited:
                row.channel.put(self._gone())
                row.released.set_result(None)
                return
            self._rows[row.row_id] = row
            self._send_locked(("start", row.row_id, row.prepared))

    def send(self, command: tuple[Any, ...]) -> None:
        with self._lock:
            self._send_locked(command)

    def _send_locked(self, command: tuple[Any, ...]) -> None:
        # A process that is gone fails its rows from the reader.
        with contextlib.suppress(OSError):
            self._connection.send_bytes(pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL))

    # ---- the reader thread ----------------------------------------------

    def _read(self) -> None:
        name_this_thread("engine-pipe")
        try:
            while True:
                message = pickle.loads(self._connection.recv_bytes())
                for row_id, kind, value, extra in message:
                    with self._lock:
                        row = self._rows.get(row_id)
                        if kind == host.RELEASED:
                            self._rows.pop(row_id, None)
                    if row is not None:
                        item = _decode(kind, value, extra)
                        self._outbox.add(row.channel.loop, (row, item), urgent=True)
                self._outbox.flush()
        except (EOFError, OSError):
            pass
        self._on_exit(self._process.wait())

    def _on_exit(self, code: int) -> None:
        with self._lock:
            self._exited = True
            rows, self._rows = list(self._rows.values()), {}
        if not self._closing:
            self.failure = RuntimeError(f"the engine process {_exit_description(code)}")
            log.error(
                "the engine process ended",
                extra={"pid": self.pid, "exit": _exit_description(code), "requests": len(rows)},
            )
        for row in rows:
            self._outbox.add(row.channel.loop, (row, self._gone()), urgent=True)
            self._outbox.add(row.channel.loop, (row, _Released(row.tally.generated)), urgent=True)
        self._outbox.flush()

    def _gone(self) -> BackendUnavailableError:
        # UNAVAILABLE, as for a backend that is down: the model serves again once reloaded.
        return BackendUnavailableError(f"model {self._name!r}: {self.failure or 'closed'}")


def _decode(kind: int, value: Any, extra: Any) -> _Item:
    if kind == host.DELTA:
        return TextDelta(value, extra)
    if kind == host.END:
        return GenerationEnd(FinishReason(value), Usage(*extra))
    if kind == host.RELEASED:
        return _Released(value)
    if kind == host.ERROR:
        return RuntimeError(value)
    return _Progress(kind, value)


def _deliver(items: list[tuple[_RemoteRow, _Item]]) -> None:
    """On a consumer's loop: its requests' items, in order."""
    for row, item in items:
        if isinstance(item, _Released):
            row.tally.generated = item.generated
            if not row.released.done():
                row.released.set_result(None)
        elif isinstance(item, _Progress):
            if item.kind == host.FIRST_TOKEN:
                row.tally.progress.first_token(float(item.value))
            else:
                row.tally.progress.generated_after_cancel(int(item.value))
        else:
            row.channel.put(item)


def _exit_description(code: int) -> str:
    if code < 0:
        return f"died with {signal.Signals(-code).name}"
    if code == host.SCHEDULER_FAILED:
        return "ended: its scheduler failed (its error is in the server's stderr)"
    return f"exited with status {code}"
