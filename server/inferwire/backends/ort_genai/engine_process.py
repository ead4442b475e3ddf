"""The engine path with its step loop in a process of its own (`engine_process: true`).

`EngineProcess` stands where `EngineStepLoop` stands in the backend (the same `stream`,
`serves`, `close`, `alive`): it starts engine_host.py with one end of a socket pair, sends
each request's commands (start with the prepared request, taken, stop) as small pickled
tuples, and a reader thread turns the host's messages (one per hand-over) into each
request's items on its event loop, through a `delivery.Outbox` as the in-process path does.

The price: the host loads the model again (its weights count twice in the memory
estimate), and a request's items cross a socket. If the host dies, every request on it
ends with UNAVAILABLE naming how, and so do new ones until a new host is ready (started
after a pause that doubles with each restart in a row); health says so meanwhile. The
per-request path, which runs in this process, goes on serving.
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
import time
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from inferwire.backends.ort_genai import engine_host
from inferwire.backends.ort_genai.engine import EngineSettings, engine_serves
from inferwire.backends.ort_genai.sampling import PathRequest
from inferwire.backends.threaded.consumer import Channel, StreamEvent, TokenTally, consume
from inferwire.backends.threaded.delivery import Outbox
from inferwire.backends.threaded.shared_thread import RESUME_AT
from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.errors import BackendUnavailableError
from inferwire.core.results import FinishReason, GenerationEnd, TextDelta, Usage
from inferwire.core.sampling import GenerationParams
from inferwire.core.threads import name_this_thread

log = logging.getLogger(__name__)

# Deltas a consumer takes before the host is told: the host sets a row aside at
# BUFFERED_DELTAS unread and resumes it at RESUME_AT, so what it is not told must stay
# under RESUME_AT for a caught-up consumer to resume it.
_TAKEN_EVERY = RESUME_AT // 2
_START_TIMEOUT_S = 600.0  # loading a large model on a slow disk
_RESTART_PAUSE_S = 0.5  # before the first restart; doubles with each restart in a row
_RESTART_PAUSE_MAX_S = 30.0
_RESTART_DOUBLINGS_MAX = 6  # 0.5 s x 2**6 is past the longest pause already
_STABLE_S = 60.0  # a host that lived this long ends a run of restarts
_HOST_MAIN = f"import sys; from {engine_host.__name__} import main; sys.exit(main(sys.argv[1:]))"


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
    prepared: PathRequest
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


@dataclass
class _Host:
    """One engine process and the server's end of its socket."""

    process: subprocess.Popen[bytes]
    connection: Connection
    started_at: float


class EngineProcess:
    """The engine path, its step loop in engine_host.py's process; restarted when it dies."""

    def __init__(
        self, path: Path, device: str, static_batch_size: int | None, settings: EngineSettings
    ) -> None:
        self._spec = json.dumps(
            {
                "path": str(path),
                "device": device,
                "static_batch_size": static_batch_size,
                "settings": asdict(settings),
                # Its log lines go to the server's stderr, at the server's level.
                "log_level": logging.getLevelName(logging.getLogger().getEffectiveLevel()),
            }
        )
        self._name = settings.name
        self._lock = threading.Lock()  # the host, the rows, the exit, writes to the socket
        self._rows: dict[int, _RemoteRow] = {}
        self._ids = itertools.count()
        self._exited = False
        self._closing = threading.Event()
        self._threads: list[threading.Thread] = []  # readers, each the restarter after its exit
        self._restarts_in_a_row = 0
        self.failure: BaseException | None = None
        self._outbox: Outbox[tuple[_RemoteRow, _Item]] = Outbox(_deliver, 0.0)
        self._host, hello = self._start_host()
        self.dynamic, self.max_batch_size, self.step_width = hello
        self._start_reader(self._host)

    @property
    def pid(self) -> int:
        return self._host.process.pid

    def _start_host(self) -> tuple[_Host, tuple[bool, int, int]]:
        ours, theirs = socket.socketpair()
        process = subprocess.Popen(
            [sys.executable, "-c", _HOST_MAIN, str(theirs.fileno()), self._spec],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
            stdout=sys.stderr,  # stdout may carry the server's own output
        )
        theirs.close()
        host = _Host(process, Connection(ours.detach()), time.monotonic())
        try:
            return host, self._await_ready(host)
        except BaseException:
            process.kill()
            process.wait()
            host.connection.close()
            raise

    def _start_reader(self, host: _Host) -> None:
        reader = threading.Thread(
            target=self._read, args=(host,), name=f"engine-pipe-{self._name}", daemon=True
        )
        with self._lock:
            self._threads = [thread for thread in self._threads if thread.is_alive()]
            self._threads.append(reader)
        reader.start()

    @staticmethod
    def _await_ready(host: _Host) -> tuple[bool, int, int]:
        if not host.connection.poll(_START_TIMEOUT_S):
            raise RuntimeError(f"the engine process did not start in {_START_TIMEOUT_S:.0f} s")
        try:
            reply = host.connection.recv()
        except EOFError:
            code = host.process.wait()
            raise RuntimeError(f"the engine process {_exit_description(code)}") from None
        if reply[0] != "ready":
            raise RuntimeError(f"the engine process could not start: {reply[1]}")
        return bool(reply[1]), int(reply[2]), int(reply[3])

    @property
    def alive(self) -> bool:
        return not self._exited and self._host.process.poll() is None

    def close(self) -> None:
        """End the process (and any restart); called once no request is in flight."""
        self._closing.set()
        self.send(("close",))
        host = self._host
        try:
            host.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            log.error("the engine process did not end; killing it", extra={"pid": self.pid})
            host.process.kill()
            host.process.wait()
        while True:  # a restart under way ends its new host itself, then its reader ends
            with self._lock:
                pending = [thread for thread in self._threads if thread.is_alive()]
            if not pending:
                break
            for thread in pending:
                thread.join()
        self._host.connection.close()

    # ---- the event-loop side --------------------------------------------

    def serves(self, params: GenerationParams, reserved: bool = False) -> bool:
        return engine_serves(self.dynamic, params, reserved)

    def stream(self, request: PathRequest, progress: GenerationProgress) -> GenerationEvents:
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
            if self._exited:  # until a restarted host is ready
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
            message = pickle.dumps(command, protocol=pickle.HIGHEST_PROTOCOL)
            self._host.connection.send_bytes(message)

    # ---- the reader thread ----------------------------------------------

    def _read(self, host: _Host) -> None:
        name_this_thread("engine-pipe")
        try:
            while True:
                message = pickle.loads(host.connection.recv_bytes())
                for row_id, kind, value, extra in message:
                    with self._lock:
                        row = self._rows.get(row_id)
                        if kind == engine_host.RELEASED:
                            self._rows.pop(row_id, None)
                    if row is not None:
                        item = _decode(kind, value, extra)
                        self._outbox.add(row.channel.loop, (row, item), urgent=True)
                self._outbox.flush()
        except (EOFError, OSError):
            pass
        self._on_exit(host, host.process.wait())
        if not self._closing.is_set():
            self._restart()

    def _on_exit(self, host: _Host, code: int) -> None:
        with self._lock:
            self._exited = True
            rows, self._rows = list(self._rows.values()), {}
            if not self._closing.is_set():
                self.failure = RuntimeError(f"the engine process {_exit_description(code)}")
        if not self._closing.is_set():
            log.error(
                "the engine process ended",
                extra={
                    "model": self._name,
                    "pid": host.process.pid,
                    "exit": _exit_description(code),
                    "requests": len(rows),
                },
            )
            if time.monotonic() - host.started_at > _STABLE_S:
                self._restarts_in_a_row = 0
        for row in rows:
            self._outbox.add(row.channel.loop, (row, self._gone()), urgent=True)
            self._outbox.add(row.channel.loop, (row, _Released(row.tally.generated)), urgent=True)
        self._outbox.flush()

    def _restart(self) -> None:
        """Start a new host after a pause that doubles with each restart in a row (a host
        that cannot start, or dies at once, is not restarted in a tight loop)."""
        while not self._closing.is_set():
            doublings = min(self._restarts_in_a_row, _RESTART_DOUBLINGS_MAX)
            pause = min(_RESTART_PAUSE_S * 2**doublings, _RESTART_PAUSE_MAX_S)
            self._restarts_in_a_row += 1
            if self._closing.wait(pause):
                return
            try:
                host, _ = self._start_host()
            except Exception as exc:
                log.error(
                    "the engine process did not restart",
                    extra={"model": self._name, "error": str(exc)},
                )
                continue
            with self._lock:
                if self._closing.is_set():
                    host.process.kill()
                    host.process.wait()
                    host.connection.close()
                    return
                old, self._host = self._host, host
                self._exited, self.failure = False, None
            old.connection.close()
            self._start_reader(host)
            log.warning(
                "the engine process restarted", extra={"model": self._name, "pid": host.process.pid}
            )
            return

    def _gone(self) -> BackendUnavailableError:
        # UNAVAILABLE, as for a backend that is down: it serves again once a new host is ready.
        return BackendUnavailableError(f"model {self._name!r}: {self.failure or 'closed'}")


def _decode(kind: int, value: Any, extra: Any) -> _Item:
    if kind == engine_host.DELTA:
        return TextDelta(value, extra)
    if kind == engine_host.END:
        return GenerationEnd(FinishReason(value), Usage(*extra))
    if kind == engine_host.RELEASED:
        return _Released(value)
    if kind == engine_host.ERROR:
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
            if item.kind == engine_host.FIRST_TOKEN:
                row.tally.progress.first_token(float(item.value))
            else:
                row.tally.progress.generated_after_cancel(int(item.value))
        else:
            row.channel.put(item)


def _exit_description(code: int) -> str:
    if code < 0:
        return f"died with {signal.Signals(-code).name}"
    if code == engine_host.STEP_LOOP_FAILED:
        return "ended: its step loop failed (its error is in the server's stderr)"
    return f"exited with status {code}"
