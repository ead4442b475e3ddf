"""HTTP/1.1 over a bare socket, for what an HTTP client library will not send: heads
that are not HTTP, bodies cut short, heads and bodies sent a byte at a time."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reply:
    status: int
    headers: dict[str, str]
    body: bytes


def parse_replies(data: bytes) -> tuple[list[Reply], bool]:
    """The whole answers in `data` (1xx left out), and whether `data` ends after one."""
    replies: list[Reply] = []
    while data:
        head, separator, rest = data.partition(b"\r\n\r\n")
        if not separator:
            return replies, False
        lines = head.split(b"\r\n")
        status = int(lines[0].split(b" ", 2)[1])
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
        length = int(headers.get("content-length", "0"))
        if len(rest) < length:
            return replies, False
        if status >= 200:
            replies.append(Reply(status, headers, rest[:length]))
        data = rest[length:]
    return replies, True


def exchange(
    port: int, data: bytes, half_close: bool = False, timeout_s: float = 30.0
) -> Reply | None:
    """Send `data` (then, with `half_close`, end the sending side), and read the first
    whole answer; None: the server closed the connection (or reset it) without one."""
    received = b""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        try:
            sock.sendall(data)
            if half_close:
                sock.shutdown(socket.SHUT_WR)
            while not parse_replies(received)[0]:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
        except (ConnectionResetError, BrokenPipeError):
            pass
        except TimeoutError:
            raise AssertionError(f"no answer within {timeout_s} s to {data[:80]!r}") from None
    replies, _ = parse_replies(received)
    return replies[0] if replies else None


@dataclass
class SlowOutcome:
    """What a slow sender saw: the server's answers, when each came and when the server
    closed the connection (None: it was still open when the sender gave up)."""

    replies: list[Reply] = field(default_factory=list)
    answered_s: list[float] = field(default_factory=list)
    closed_s: float | None = None


def slow_sender(port: int, first: bytes, drip: bytes, every_s: float, cap_s: float) -> SlowOutcome:
    """Send `first` at once, then `drip` one byte every `every_s` (from its start again
    at its end; an empty `drip`: nothing), until the server closes or `cap_s` passes."""
    outcome, received, sent = SlowOutcome(), b"", 0
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=every_s) as sock:
        try:
            sock.sendall(first)
            while (elapsed := time.monotonic() - started) < cap_s:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    if drip:
                        sock.sendall(drip[sent % len(drip) :][:1])
                        sent += 1
                    continue
                if not chunk:
                    outcome.closed_s = elapsed
                    break
                received += chunk
                replies, _ = parse_replies(received)
                outcome.answered_s += [elapsed] * (len(replies) - len(outcome.replies))
                outcome.replies = replies
        except (ConnectionResetError, BrokenPipeError):
            outcome.closed_s = time.monotonic() - started
    return outcome
