"""The frame of every batching engine: one thread steps many requests at once.

An engine's step loop (`StepLoop`) owns one thread. The event loop sends it commands
(`start`, `cancel`, `resume`) through an inbox; between steps the thread applies them,
admits waiting requests and takes one step, then hands the step's items over
(threaded/shared_thread.py `Handover`). Written once here: the inbox on a condition
variable, `send` / `alive` / `close`, the command switch, and the failure path, which ends
every request the loop holds with the error (and refuses those sent after it), so that no
consumer is left waiting on a thread that is gone. An engine supplies only what is its
own: opening its engine on the thread (`_open`), admitting (`_admit`), a step (`_step`),
and what cancel, resume and close mean for a request it is running. An engine whose
requests each hold a slot of its KV cache (`SlotStepLoop`: the llama.cpp step loop, the
continuous path) supplies only whether a slot is free, how a request takes one, and how
it ends.

"Step loop" is this thread's loop, never the core's fair queue (core/scheduling.py).
"""

from __future__ import annotations

import abc
import asyncio
import collections
import logging
import threading
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from inferwire.backends.threaded.consumer import Channel, StreamEvent, TokenTally, consume
from inferwire.backends.threaded.shared_thread import (
    BUFFERED_DELTAS,
    Command,
    Handover,
    SharedThreadRequest,
)
from inferwire.core.backend import GenerationEvents, GenerationProgress
from inferwire.core.prepared import PreparedRequest
from inferwire.core.results import FinishReason
from inferwire.core.threads import name_this_thread

log = logging.getLogger(__name__)

RequestT = TypeVar("RequestT", bound=SharedThreadRequest)


class StepLoop(abc.ABC, Generic[RequestT]):
    """One engine's thread and the requests it holds; see the module's docstring."""

    what = "step loop"  # a failure's words: `the llama.cpp step loop stopped: ...`

    def __init__(self, thread_name: str, os_name: str, handover: Handover) -> None:
        """`os_name`: the thread's name for the OS (core/threads.py; bench/cpu.py reads it)."""
        self._os_name = os_name
        self._wakeup = threading.Condition()
        self._inbox: list[tuple[Command, RequestT]] = []
        self._closing = False
        self._waiting: collections.deque[RequestT] = collections.deque()
        self._handover = handover
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=thread_name, daemon=True)
        self._opened = threading.Event()

    def start(self) -> None:
        """Start the thread; return once `_open` ran there, raising what it raised."""
        self._thread.start()
        self._opened.wait()
        if self.failure is not None:
            self._thread.join()
            raise self.failure

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait(self) -> None:
        """Until the thread ends: closed, or stopped by a failure (`failure`)."""
        self._thread.join()

    def close(self) -> None:
        """Stop the thread, then free the engine (`_closed`); once no request is in flight."""
        with self._wakeup:
            self._closing = True
            self._wakeup.notify()
        self._thread.join()
        self._closed()

    # ---- the event-loop side --------------------------------------------

    def send(self, command: Command, request: SharedThreadRequest) -> None:
        with self._wakeup:
            if self.failure is None:
                self._inbox.append((command, request))  # type: ignore[arg-type]
                self._wakeup.notify()
                return
        # The thread is gone: nothing will run this request; its consumer hears so now.
        request.channel.loop.call_soon_threadsafe(self._refuse, request)

    def _consume(self, request: RequestT, coalesce: bool) -> GenerationEvents:
        """The consumer's side of `request` (which `start` sends here)."""
        return consume(request.channel, request, request.tally, coalesce)

    def _refuse(self, request: SharedThreadRequest) -> None:
        request.channel.put(self._stopped(self.failure))
        if not request.released.done():
            request.released.set_result(None)

    def _stopped(self, failure: BaseException | None) -> RuntimeError:
        return RuntimeError(f"the {self.what} stopped: {failure!r}")

    # ---- the thread -----------------------------------------------------

    def _run(self) -> None:
        name_this_thread(self._os_name)
        try:
            self._open()
        except BaseException as exc:
            self.failure = exc
            return
        finally:
            self._opened.set()
        try:
            self._loop()
        except BaseException as exc:  # a bug here must not leave consumers waiting
            log.exception("%s stopped", self.what)
            with self._wakeup:
                self.failure = exc
                inbox, self._inbox = self._inbox, []
            stopped = self._stopped(exc)
            held = dict.fromkeys([*self._holding(), *(request for _, request in inbox)])
            for request in held:
                self._emit(request, stopped)
                self._release(request)
            self._handover.flush(force=True)

    def _loop(self) -> None:
        while True:
            with self._wakeup:
                while not (self._inbox or self._runnable() or self._closing):
                    self._wakeup.wait()
                inbox, self._inbox = self._inbox, []
                if self._closing and not inbox and not self._runnable():
                    return
            for command, request in inbox:
                self._apply(command, request)
            self._admit()
            if self._runnable():
                self._step()
            # Before the thread may wait for work, everything goes out.
            self._handover.flush(force=not self._runnable())

    def _apply(self, command: Command, request: RequestT) -> None:
        if command == "start":
            if request.closed:
                self._release(request)
            else:
                self._waiting.append(request)
        elif command == "resume":
            self._resume(request)
        elif request in self._waiting:  # cancel, before it began
            self._waiting.remove(request)
            self._release(request)
        else:
            self._cancel(request)

    def _emit(self, request: RequestT, item: StreamEvent) -> None:
        self._handover.emit(request, item)

    def _release(self, request: RequestT) -> None:
        self._handover.release(request)

    # ---- what each engine supplies --------------------------------------

    def _open(self) -> None:
        """Open the engine, on the thread (an engine that must be used from the thread that
        made it); a failure here is `start`'s."""

    @abc.abstractmethod
    def _runnable(self) -> bool:
        """Whether a step has something to do (admitting included)."""

    @abc.abstractmethod
    def _admit(self) -> None:
        """Begin what waits in `_waiting`, as far as the engine has room."""

    @abc.abstractmethod
    def _step(self) -> None:
        """One step of every running request; emits and releases what it finished."""

    @abc.abstractmethod
    def _resume(self, request: RequestT) -> None:
        """The consumer of a request set aside for it (`paused`) caught up."""

    @abc.abstractmethod
    def _cancel(self, request: RequestT) -> None:
        """The consumer of a request that began left: stop it, release it once stopped."""

    @abc.abstractmethod
    def _holding(self) -> Iterable[RequestT]:
        """Every request the loop holds, waiting or begun: a failure ends them all."""

    def _closed(self) -> None:
        """Free the engine once the thread has ended."""


class SlotStepLoop(StepLoop[RequestT]):
    """A step loop whose running requests each hold a slot (`request.slot`, None until
    seated): admitting seats waiting requests while a slot is free, a request that cannot
    be seated ends with why, and a cancelled one ends where it stands."""

    def _handed_over(self, prepared: PreparedRequest[Any], progress: GenerationProgress) -> Any:
        """The fields every request of the loop has (`SharedThreadRequest`'s, and the
        prepared request), made on the event loop that will consume it."""
        loop = asyncio.get_running_loop()
        return {
            "send": self.send,
            "prepared": prepared,
            "tally": TokenTally(progress, len(prepared.prompt_ids)),
            "channel": Channel(loop),
            "released": loop.create_future(),
        }

    def _admit(self) -> None:
        while self._waiting and self._slot_free():
            request = self._waiting.popleft()
            try:
                self._seat(request)
            except Exception as exc:
                self._emit(request, exc)
                self._release(request)

    def _cancel(self, request: RequestT) -> None:
        if getattr(request, "slot", None) is not None:
            self._finish(request, None)

    def _went_out(self, request: RequestT, token: int, at_length: bool) -> None:
        """`request`'s token `token` went out: at its length it ends; else `token` is what
        it reads next, and it is set aside while its consumer is BUFFERED_DELTAS behind."""
        if at_length:
            self._finish(request, request.tally.end(FinishReason.LENGTH))
            return
        self._read_next(request, token)
        if request.unread >= BUFFERED_DELTAS:
            request.paused = True

    @abc.abstractmethod
    def _read_next(self, request: RequestT, token: int) -> None:
        """`token` is the next one `request`'s slot reads (in the next step)."""

    @abc.abstractmethod
    def _slot_free(self) -> bool:
        """Whether a waiting request could take a slot now."""

    @abc.abstractmethod
    def _seat(self, request: RequestT) -> None:
        """Give `request` a slot (raising, it is refused with the error)."""

    @abc.abstractmethod
    def _finish(self, request: RequestT, item: StreamEvent | None) -> None:
        """End a seated `request` with `item` (None: its consumer left) and free its slot."""
