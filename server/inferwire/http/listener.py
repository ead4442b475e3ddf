"""uvicorn on the server's own event loop: one process, one core, one set of models.

`HttpListener` binds `server.http_address` (port 0 picks a free port), serves the Starlette
app with uvicorn's httptools protocol, and stops in step with the gRPC listener: new
connections are refused, requests in flight (streams included) get the grace period,
then what is left is cancelled.

TLS uses the same `server.tls` files as gRPC and rotates with them: the TLS context's SNI
callback asks `CertificateFiles.changed` before each handshake and swaps in a new context
when the files changed. With a client CA, client certificates are required, and a
connection's certificate subjects (CN, then the subject alternative names) reach the
request (`TLS_SUBJECTS` in the ASGI state) for `server.auth.certificate_tenants`.

Every request's head (request line and headers) must arrive within
`server.http_read_timeout_s` of its first byte (a new connection's first request: of the
connection), and the rest of a body the server answered before it ended (408, 413)
within as long again, else the connection is closed; idle keep-alive connections close
after uvicorn's 5 s. A head over `server.transport.max_metadata_bytes` is 431, one that
httptools cannot parse 400, each with OpenAI's error body and the connection closed. So
slow senders (slowloris) and endless headers hold a connection for a bounded time and
memory.
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import ssl
from typing import Any

import uvicorn
from starlette.types import ASGIApp

# httptools (a dependency): its parser's callbacks mark where each request's head ends.
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as _Protocol

from inferwire.addresses import split_host_port
from inferwire.edge.certificates import CertificateFiles
from inferwire.edge.errors import (
    HeadTooLargeError,
    MalformedRequestError,
    RequestRefusedError,
    error_reply,
)
from inferwire.http.calls import TLS_SUBJECTS
from inferwire.http.errors import http_answer

log = logging.getLogger(__name__)


def _subjects(certificate: dict[str, Any]) -> list[str]:
    subjects = [
        value for rdn in certificate.get("subject", ()) for key, value in rdn if key == "commonName"
    ]
    subjects += [value for _, value in certificate.get("subjectAltName", ())]
    return subjects


class _HeadTooLarge(Exception):
    """Raised from a parser callback: the head is refused (431) and the parser stops."""


class _Protocol_WithCertificate(_Protocol):
    """uvicorn's protocol, plus the client certificate's subjects and bounds on what a
    client sends: each request's head in time (`read_timeout_s`) and size
    (`max_header_bytes`), and the rest of a body answered early in time."""

    read_timeout_s: float  # set by protocol_class
    max_header_bytes: int

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # asyncio sets TCP_NODELAY only on sockets it made itself (proto IPPROTO_TCP); ours
        # come from a socket we bound, so without this Nagle holds every small event after
        # a keep-alive connection's first few (once the client delays its ACKs), and a
        # stream arrives in one piece up to 40 ms late (docs/performance.md).
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        ssl_object = transport.get_extra_info("ssl_object")
        certificate = ssl_object.getpeercert() if ssl_object is not None else None
        if certificate:
            # Each request's ASGI state is a copy of this: the subjects ride with them.
            self.app_state = {**self.app_state, TLS_SUBJECTS: tuple(_subjects(certificate))}
        # While the server waits for bytes no handler waits for (a request's head, or the
        # rest of a body after its answer went out): the deadline; and the head's bytes.
        self._read_deadline: asyncio.TimerHandle | None = None
        self._in_head, self._head_bytes = True, 0
        self._arm_read_deadline()

    def _arm_read_deadline(self) -> None:
        if self._read_deadline is None:
            self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_late)

    def _disarm_read_deadline(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None

    def _read_late(self) -> None:
        self._read_deadline = None
        if not self.transport.is_closing():
            self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._in_head and self._head_bytes > self.max_header_bytes:
            self._refuse_head()  # not even ended, and too large already

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_read_deadline()

    def on_headers_complete(self) -> None:
        self._disarm_read_deadline()
        self._in_head, self._head_bytes = False, 0
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self.max_header_bytes:
            self._refuse_head()
            # Stops the parser; uvicorn answers that (a 400) on a connection already closed.
            raise _HeadTooLarge
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm_read_deadline()
        super().on_message_complete()
        self._in_head = True  # what comes next is the next request's head

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if self.cycle is not None and self.cycle.more_body:
            # Answered before its body ended (408, 413, 401...): the rest is read and
            # dropped, within the same time.
            self._arm_read_deadline()

    def send_400_response(self, msg: str) -> None:
        self._refuse(MalformedRequestError("the request is not valid HTTP/1.1", None))

    def _refuse_head(self) -> None:
        why = f"the request's head (line and headers) is over {self.max_header_bytes} bytes"
        self._refuse(HeadTooLargeError(why, "headers"))

    def _refuse(self, refusal: RequestRefusedError) -> None:
        """Answer `refusal` (before any call: through the one table here) with OpenAI's
        error body, and close the connection."""
        self._disarm_read_deadline()
        self._in_head = False
        if self.transport.is_closing():
            return
        status, answer, _ = http_answer(error_reply(refusal))
        body = json.dumps(answer).encode()
        reason = {400: b"Bad Request", 431: b"Request Header Fields Too Large"}[status]
        head = b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\n" % (status, reason)
        head += b"content-length: %d\r\nconnection: close\r\n\r\n" % len(body)
        self.transport.write(head + body)
        self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_read_deadline()
        super().connection_lost(exc)


def protocol_class(read_timeout_s: float, max_header_bytes: int) -> type[_Protocol]:
    """The HTTP protocol with this server's bounds on a request's head."""
    bounds = {"read_timeout_s": read_timeout_s, "max_header_bytes": max_header_bytes}
    return type("HttpProtocol", (_Protocol_WithCertificate,), bounds)


class _RotatingContext:
    """A server TLS context over `server.tls`, replaced when its files change."""

    def __init__(self, files: CertificateFiles) -> None:
        self._files = files
        self.context = self._make()

    def _make(self) -> ssl.SSLContext:
        settings = self._files.settings
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        assert settings.cert_file is not None and settings.key_file is not None
        context.load_cert_chain(settings.cert_file, settings.key_file)
        if settings.client_ca_file is not None:
            context.load_verify_locations(settings.client_ca_file)
            context.verify_mode = ssl.CERT_REQUIRED
        context.set_alpn_protocols(["http/1.1"])
        context.sni_callback = self._before_handshake
        return context

    def _before_handshake(self, ssl_object: ssl.SSLObject, name: str | None, _: Any) -> None:
        if self._files.changed() is not None:
            try:
                self.context = self._make()
            except (OSError, ssl.SSLError):
                log.exception("TLS: the new certificate files do not load; keeping the old ones")
        ssl_object.context = self.context


class HttpListener:
    """The HTTP listener: `start()` binds and serves, `stop()` drains."""

    def __init__(
        self,
        app: ASGIApp,
        address: str,
        tls: CertificateFiles | None,
        read_timeout_s: float,
        max_header_bytes: int,
    ) -> None:
        self.address = address
        self._protocol = protocol_class(read_timeout_s, max_header_bytes)
        self._app = app
        self._tls = _RotatingContext(tls) if tls is not None else None
        self._server: uvicorn.Server | None = None
        self._ticks: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = None

    def _bind(self) -> socket.socket:
        host, port = split_host_port(self.address)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as error:
            sock.close()
            raise OSError(
                f"server.http_address: could not listen on {self.address}: "
                f"{error.strerror or error}"
            ) from None
        sock.listen(1024)
        sock.setblocking(False)
        return sock

    async def start(self, grace_s: float) -> int:
        """Serve on the running loop; returns the bound port."""
        self._socket = self._bind()
        tls = self._tls
        config = uvicorn.Config(
            self._app,
            http=self._protocol,
            ws="none",  # no WebSocket routes: an Upgrade is served as plain HTTP
            lifespan="off",
            log_config=None,
            access_log=False,  # the edge writes the access line
            server_header=False,
            timeout_graceful_shutdown=int(max(grace_s, 1)),
            ssl_context_factory=(lambda _config, _default: tls.context) if tls else None,
        )
        config.load()
        self._server = uvicorn.Server(config)
        # What uvicorn.Server.serve does before its startup, less taking the signals:
        # SIGTERM is the house's, which drains both doors.
        self._server.lifespan = config.lifespan_class(config)
        await self._server.startup(sockets=[self._socket])
        self._ticks = asyncio.create_task(self._server.main_loop(), name="http-ticks")
        port: int = self._socket.getsockname()[1]
        return port

    async def stop(self) -> None:
        """Refuse new connections; let requests in flight finish within the grace period."""
        server, self._server = self._server, None
        if server is None:
            return
        server.should_exit = True
        if self._ticks is not None:
            await self._ticks
        await server.shutdown(sockets=[self._socket] if self._socket else None)
