"""The per-request path's turns (ort_genai/generator.py `Turns`): one generator steps at a
time, a slice each, and the turn goes to the threads in the order they asked."""

from __future__ import annotations

import threading
import time

from inferwire.backends.ort_genai.generator import Turns


def test_one_thread_steps_at_a_time_and_the_waiting_take_their_turns_in_order() -> None:
    turns = Turns()
    inside, most, order = 0, 0, []
    lock = threading.Lock()

    def generator(name: int) -> None:
        nonlocal inside, most
        for _ in range(3):
            turns.take()
            with lock:
                inside += 1
                most = max(most, inside)
                order.append(name)
            time.sleep(Turns.SLICE_S)  # a step that fills the slice: the turn is handed on
            with lock:
                inside -= 1
            turns.stepped()
        turns.leave()

    # The test holds the turn while the four ask for it one after the other, so they queue
    # in the order 0, 1, 2, 3 however fast the machine is; then it lets them go.
    turns.take()
    threads = [threading.Thread(target=generator, args=(n,)) for n in range(4)]
    for queued, thread in enumerate(threads, start=1):
        thread.start()
        deadline = time.monotonic() + 10
        while turns.waiting < queued:
            assert time.monotonic() < deadline, "a thread never asked for its turn"
            time.sleep(0.001)
    turns.leave()
    for thread in threads:
        thread.join(timeout=10)
    assert most == 1
    # Each hands the turn on after its slice and asks again at the back of the queue.
    assert order == [0, 1, 2, 3] * 3


def test_a_thread_keeps_its_turn_through_its_slice_when_nobody_waits() -> None:
    turns = Turns()
    turns.take()
    turns.stepped()
    turns.take()  # still ours: no hand-over, no wait
    turns.leave()
    done = threading.Event()
    other = threading.Thread(target=lambda: (turns.take(), turns.leave(), done.set()))
    other.start()
    assert done.wait(5)


def test_turns_passed_on_every_step_never_get_lost(monkeypatch) -> None:
    # A hand-over once overwrote the woken thread's claim, and every thread waited forever.
    monkeypatch.setattr(Turns, "SLICE_S", 0.0)
    turns = Turns()
    steps = [0] * 8

    def generator(name: int) -> None:
        for _ in range(300):
            turns.take()
            steps[name] += 1
            turns.stepped()
        turns.leave()

    threads = [threading.Thread(target=generator, args=(n,), daemon=True) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert steps == [300] * 8


def test_a_requests_first_step_goes_ahead_of_the_steps_waiting() -> None:
    turns = Turns()
    turns.take()  # a stream is stepping
    order: list[str] = []

    def waiter(name: str, first: bool) -> None:
        turns.take(first=first)
        order.append(name)
        turns.leave()

    decoding = threading.Thread(target=waiter, args=("decode", False))
    decoding.start()
    time.sleep(0.05)  # the decode step waits first
    prompt = threading.Thread(target=waiter, args=("prompt", True))
    prompt.start()
    time.sleep(0.05)
    turns.leave()
    decoding.join(5)
    prompt.join(5)
    assert order == ["prompt", "decode"]
