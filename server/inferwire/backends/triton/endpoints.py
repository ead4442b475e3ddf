"""The Triton servers behind one model: channels, health, round-robin and failover.

Each endpoint has its own channel, with keepalive pings that find a half-open connection.
Requests go round-robin over the endpoints that passed the last health check, whose
channel is not failing and that are not much slower than the fastest (the round trip of
the health check, averaged). A request that fails to reach an endpoint before any
response moves on to the next one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferwire.backends.triton.errors import Origin, rpc_error, stream_error
from inferwire.backends.triton.options import TritonOptions
from inferwire.core.errors import BackendUnavailableError
from inferwire.wire.oip import FINAL_RESPONSE

try:  # the inferwire[otel] extra
    from opentelemetry.context import get_current as current_trace_context
    from opentelemetry.propagate import inject as inject_trace_context
except ImportError:
    inject_trace_context = None  # type: ignore[assignment]

log = logging.getLogger(__package__)

_MAX_MESSAGE_BYTES = 2**31 - 1
# Asks Triton to end a stream with the error's status code rather than put the error,
# without its code, in a response message (see errors.py). Older Tritons ignore it.
_STREAM_ERROR_HEADER = ("triton_grpc_error", "true")
# How long an answered stream may take to end before it is cancelled after all.
STREAM_END_S = 5.0
# An endpoint whose averaged health-check round trip exceeds both twice the fastest one's
# and the fastest one's plus this margin gets no requests while a faster one is usable:
# loopback and LAN jitter stay well below it, a slow link or an overloaded server do not.
SLOW_MARGIN_S = 0.05
# Weight of the newest round trip in the average: a change shows within a few checks.
_ROUND_TRIP_WEIGHT = 0.5


def trace_metadata() -> tuple[tuple[str, str], ...]:
    """The current trace context (W3C `traceparent`, `tracestate`) as gRPC metadata.

    Empty without the otel extra or outside a traced request.
    """
    if inject_trace_context is None or not current_trace_context():
        return ()  # an empty context (tracing off) has nothing to propagate
    carrier: dict[str, str] = {}
    inject_trace_context(carrier)
    return tuple(carrier.items())


@dataclass
class Endpoint:
    """One Triton server: its channel, and what the last health check found."""

    url: str
    channel: grpc.aio.Channel
    stub: service_pb2_grpc.GRPCInferenceServiceStub
    # ModelStreamInfer called as unary-stream: see one_request_stream.
    stream: grpc.aio.UnaryStreamMultiCallable
    healthy: bool = True
    detail: str = ""
    lost_model: bool = False  # the server is live but the model is not ready (a restart)
    in_flight: int = 0  # requests sent here that have not ended
    draining: bool = False  # gone from DNS: no new requests; closes once idle
    round_trip_s: float | None = None  # ServerLive's round trip, averaged over checks

    def usable(self) -> bool:
        state = self.channel.get_state(try_to_connect=False)
        return self.healthy and state is not grpc.ChannelConnectivity.TRANSIENT_FAILURE

    def measured(self, round_trip_s: float) -> None:
        """Fold one health check's round trip into the average."""
        if self.round_trip_s is None:
            self.round_trip_s = round_trip_s
        else:
            weight = _ROUND_TRIP_WEIGHT
            self.round_trip_s = weight * round_trip_s + (1 - weight) * self.round_trip_s


def slow_ones(endpoints: Sequence[Endpoint]) -> list[Endpoint]:
    """The endpoints much slower than the fastest of `endpoints` (see SLOW_MARGIN_S)."""
    known = [ep.round_trip_s for ep in endpoints if ep.round_trip_s is not None]
    if not known:
        return []
    fastest = min(known)
    limit = max(2 * fastest, fastest + SLOW_MARGIN_S)
    return [ep for ep in endpoints if ep.round_trip_s is not None and ep.round_trip_s > limit]


class EndpointPool:
    """The endpoints serving one model; empty until opened, and again once closed."""

    def __init__(self, model_name: str, triton_model: str, options: TritonOptions) -> None:
        self.model_name = model_name
        self.triton_model = triton_model
        self.options = options
        self.endpoints: list[Endpoint] = []
        # Request headers, e.g. the --grpc-restricted-protocol key.
        self.metadata = tuple((k.lower(), v) for k, v in options.headers.items())
        self._rotation = itertools.count()
        # With DNS discovery: endpoints loading the model, and those draining.
        self.joining: dict[str, Endpoint] = {}
        self.draining: list[Endpoint] = []
        self._closing: set[asyncio.Task[None]] = set()
        self._channel_options: list[tuple[str, int]] = []
        self._credentials: grpc.ChannelCredentials | None = None
        # Called when requests find no usable endpoint (DNS discovery resolves again).
        self.on_trouble: Callable[[], None] | None = None

    async def open(self, urls: Sequence[str] | None = None) -> None:
        """Open a channel to each endpoint (default: the configured ones), unless open."""
        if self.endpoints:
            return
        options = [
            ("grpc.max_send_message_length", _MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES),
            # Reconnect soon after a Triton restart, so health recovers within seconds.
            ("grpc.initial_reconnect_backoff_ms", 200),
            ("grpc.min_reconnect_backoff_ms", 200),
            ("grpc.max_reconnect_backoff_ms", int(self.options.max_reconnect_backoff_s * 1000)),
            # Pings while requests are in flight: a Triton that vanished without a reset
            # (a half-open connection) fails its requests at once, not at the TCP timeout.
            ("grpc.keepalive_time_ms", int(self.options.keepalive_time_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(self.options.keepalive_timeout_s * 1000)),
            # gRPC core waits this long for any ping's ack (60 s by default), keepalive's too.
            ("grpc.http2.ping_timeout_ms", int(self.options.keepalive_timeout_s * 1000)),
        ]
        credentials = None
        if self.options.uses_tls:
            files = (self.options.tls_root_cert, self.options.tls_key, self.options.tls_cert)
            root, key, chain = await asyncio.to_thread(
                lambda: tuple(Path(p).read_bytes() if p else None for p in files)
            )
            credentials = grpc.ssl_channel_credentials(root, key, chain)
        self._channel_options, self._credentials = options, credentials
        self.endpoints = [self._connect(url) for url in (urls or self.options.endpoints)]

    def _connect(self, url: str) -> Endpoint:
        if self._credentials is not None:
            channel = grpc.aio.secure_channel(url, self._credentials, options=self._channel_options)
        else:
            channel = grpc.aio.insecure_channel(url, options=self._channel_options)
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        return Endpoint(url, channel, stub, one_request_stream(channel))

    async def close(self) -> None:
        endpoints, self.endpoints = self.endpoints, []
        endpoints += [*self.joining.values(), *self.draining]
        self.joining, self.draining = {}, []
        for endpoint in endpoints:
            await endpoint.channel.close()
        await asyncio.gather(*self._closing)

    @property
    def urls(self) -> set[str]:
        """The endpoints in rotation and those joining it."""
        return {ep.url for ep in self.endpoints} | set(self.joining)

    def add(self, url: str) -> Endpoint:
        """Open a channel to a new endpoint; it gets no requests until `admit`ted."""
        endpoint = self._connect(url)
        endpoint.healthy, endpoint.detail = False, "joining: loading the model"
        self.joining[url] = endpoint
        return endpoint

    def admit(self, endpoint: Endpoint) -> None:
        """Put a joined endpoint (the model loaded, healthy) into the rotation."""
        if self.joining.pop(endpoint.url, None) is endpoint:
            self.endpoints.append(endpoint)

    def drain(self, url: str) -> None:
        """Take an endpoint out of the rotation at once; close it once idle."""
        endpoint = self.joining.pop(url, None)
        if endpoint is None:
            endpoint = next((ep for ep in self.endpoints if ep.url == url), None)
            if endpoint is None:
                return
            self.endpoints.remove(endpoint)
        endpoint.draining = True
        self.draining.append(endpoint)
        self._close_if_idle(endpoint)

    def _close_if_idle(self, endpoint: Endpoint) -> None:
        if endpoint.draining and endpoint.in_flight == 0 and endpoint in self.draining:
            self.draining.remove(endpoint)
            task = asyncio.create_task(endpoint.channel.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    @contextmanager
    def _in_flight(self, endpoint: Endpoint) -> Iterator[None]:
        endpoint.in_flight += 1
        try:
            yield
        finally:
            endpoint.in_flight -= 1
            self._close_if_idle(endpoint)

    def _trouble(self) -> None:
        if self.on_trouble is not None:
            self.on_trouble()

    def pick(self, exclude: Sequence[Endpoint] = ()) -> Endpoint:
        """Round-robin over the usable endpoints that are not slow, or over all usable
        ones when all are slow, or over every one when none looks usable."""
        if len(self.endpoints) == 1 and not exclude:
            # One server (the usual case): the same answer, without building the lists.
            only = self.endpoints[0]
            if not only.usable():
                self._trouble()
            next(self._rotation)
            return only
        candidates = [ep for ep in self.endpoints if ep not in exclude]
        if not candidates:
            self._trouble()
            raise BackendUnavailableError(f"model {self.model_name!r}: no Triton endpoint left")
        usable = [ep for ep in candidates if ep.usable()]
        if not usable:
            self._trouble()
        usable = usable or candidates
        slow = slow_ones(usable)
        usable = [ep for ep in usable if ep not in slow] or usable
        return usable[next(self._rotation) % len(usable)]

    def error(self, exc: grpc.aio.AioRpcError, endpoint: Endpoint, origin: Origin) -> Exception:
        """What `endpoint` answered, as a domain error about this model."""
        return rpc_error(
            exc, origin, url=endpoint.url, model=self.model_name, triton_model=self.triton_model
        )

    async def model_ready(
        self, endpoint: Endpoint, timeout: float, wait_for_ready: bool = False
    ) -> bool:
        response = await endpoint.stub.ModelReady(
            service_pb2.ModelReadyRequest(name=self.triton_model, version=self.options.version),
            metadata=self.metadata,
            timeout=timeout,
            wait_for_ready=wait_for_ready,
        )
        return bool(response.ready)

    async def wait_until_reachable(self, endpoint: Endpoint) -> bool:
        """Whether the model is ready there, waiting up to connect_timeout_s for Triton.

        Triton may still be starting, so the first call waits for the connection. If it
        never comes, the error says why the connection failed (say, connection refused),
        not that a deadline passed.
        """
        timeout = self.options.connect_timeout_s
        try:
            return await self.model_ready(endpoint, timeout, wait_for_ready=True)
        except grpc.aio.AioRpcError as exc:
            if exc.code() is not grpc.StatusCode.DEADLINE_EXCEEDED:
                raise
        try:  # once more without waiting: the channel's own error names the cause
            return await self.model_ready(endpoint, self.options.health_timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise BackendUnavailableError(
                f"could not connect to Triton at {endpoint.url} within {timeout:g} s: "
                f"{exc.details() or exc.code().name}"
            ) from None

    async def check(self) -> None:
        """Refresh every endpoint's health."""
        await asyncio.gather(*(self.check_one(endpoint) for endpoint in self.endpoints))

    async def check_one(self, endpoint: Endpoint) -> None:
        """ServerLive, and ModelReady for the model we loaded (its configured version).

        Never ServerReady: it is server-wide, false while any model of the repository
        loads and for as long as any failed to load (`--strict-readiness`, the default), so
        one sibling loading or broken would take every model on that Triton out of service.
        """
        timeout = self.options.health_timeout_s
        try:
            sent = time.monotonic()
            live = await endpoint.stub.ServerLive(
                service_pb2.ServerLiveRequest(), metadata=self.metadata, timeout=timeout
            )
            endpoint.measured(time.monotonic() - sent)
            model_ready = live.live and await self.model_ready(endpoint, timeout)
        except grpc.aio.AioRpcError as exc:
            endpoint.healthy, endpoint.detail = False, f"{exc.code().name}: {exc.details()}"
            endpoint.lost_model = False
            return
        except asyncio.CancelledError:
            if not endpoint.draining:
                raise
            # Drained while checked: closing its channel cancelled the RPC.
            endpoint.healthy, endpoint.detail = False, "draining"
            return
        endpoint.lost_model = bool(live.live and not model_ready)
        if not live.live:
            endpoint.healthy, endpoint.detail = False, "server not live"
        elif not model_ready:
            endpoint.healthy, endpoint.detail = False, "model not ready"
        else:
            endpoint.healthy, endpoint.detail = True, ""

    async def infer(
        self, message: service_pb2.ModelInferRequest, *, timeout: float | None
    ) -> service_pb2.ModelInferResponse:
        """One ModelInfer (a model that is not decoupled), from the first endpoint that
        takes it: a request that got no response can always move on."""
        tried: list[Endpoint] = []
        while True:
            endpoint = self.pick(exclude=tried)
            tried.append(endpoint)
            endpoint.in_flight += 1  # as _in_flight does, without a context manager per call
            try:
                return await endpoint.stub.ModelInfer(
                    message, metadata=(*self.metadata, *trace_metadata()), timeout=timeout
                )
            except grpc.aio.AioRpcError as exc:
                self._move_on_or_raise(exc, endpoint, tried, received=False)
            finally:
                endpoint.in_flight -= 1
                self._close_if_idle(endpoint)

    async def responses(
        self, message: service_pb2.ModelInferRequest, *, decoupled: bool, timeout: float | None
    ) -> AsyncGenerator[service_pb2.ModelInferResponse, None]:
        """The request's responses, from the first endpoint that takes it.

        Moving on to another endpoint is safe only before any response arrived; after
        that, a lost connection is the caller's UNAVAILABLE.
        """
        if not decoupled:
            yield await self.infer(message, timeout=timeout)
            return
        tried: list[Endpoint] = []
        while True:
            endpoint = self.pick(exclude=tried)
            tried.append(endpoint)
            with self._in_flight(endpoint):
                received = False
                try:
                    call = endpoint.stream(
                        message,
                        metadata=(*self.metadata, _STREAM_ERROR_HEADER, *trace_metadata()),
                        timeout=timeout,
                    )
                    answered = False  # Triton sent this request's last response or error
                    try:
                        async for item in call:
                            if item.error_message:
                                answered = True
                                raise stream_error(
                                    item.error_message,
                                    url=endpoint.url,
                                    model=self.model_name,
                                    triton_model=self.triton_model,
                                )
                            received = True
                            answered = item.infer_response.parameters[FINAL_RESPONSE].bool_param
                            yield item.infer_response
                            if answered:
                                return
                    finally:
                        await _end_stream(call, answered)
                    return
                except grpc.aio.AioRpcError as exc:
                    self._move_on_or_raise(exc, endpoint, tried, received)

    def _move_on_or_raise(
        self,
        exc: grpc.aio.AioRpcError,
        endpoint: Endpoint,
        tried: list[Endpoint],
        received: bool,
    ) -> None:
        """Return when the request may move on to another endpoint; else raise its error."""
        error = self.error(exc, endpoint, Origin.RPC)
        if (
            isinstance(error, BackendUnavailableError)
            and not received
            and len(tried) < len(self.endpoints)
        ):
            endpoint.healthy = False
            endpoint.detail = f"UNAVAILABLE: {exc.details()}"
            self._trouble()
            log.warning(
                "Triton endpoint unreachable; trying another",
                extra={"model": self.model_name, "url": endpoint.url},
            )
            return
        if isinstance(error, BackendUnavailableError):
            self._trouble()
        raise error from None


def one_request_stream(channel: grpc.aio.Channel) -> grpc.aio.UnaryStreamMultiCallable:
    """ModelStreamInfer for one request: its message and the end of the requests go in one
    write, as in any unary-stream call (the wire does not tell the two kinds apart).

    tritonserver 2.51 (the one nvidia-pytriton ships) can crash with SIGSEGV when the read
    it keeps pending for a next request completes while it ends the stream (an error
    answer in `triton_grpc_error` mode, or a connection cut mid-answer): that read's state
    is released twice. Sent in the same write, the end of the requests completes the read
    before the model has answered. Runs of our error test (12 requests ending in errors)
    that crashed it: end of the requests in a write of its own, 2 of 60; request side open
    until the answer began, 1 of 30; until it ended, 0 of 30, but then 1 of 9 runs of the
    faults tier, which cuts connections mid-answer; in the same write, 0 of 120 and 0 of
    10. Upstream fixed these in 2.54 to 2.68 (server PRs 7840, 8078, 8708)."""
    return channel.unary_stream(
        "/inference.GRPCInferenceService/ModelStreamInfer",
        request_serializer=service_pb2.ModelInferRequest.SerializeToString,
        response_deserializer=service_pb2.ModelStreamInferResponse.FromString,
    )


async def _end_stream(call: grpc.aio.UnaryStreamCall, answered: bool) -> None:
    """Let an answered stream end on its own (its request side is closed, so Triton ends
    it after the last response); cancel one that was left early.

    A cancel that reaches Triton while it still completes the last response races its
    ModelStreamInfer handler, which in 2.51 can free the request's state twice (upstream
    fix: server PR 8078, March 2025)."""
    if answered:
        try:
            await asyncio.wait_for(call.code(), STREAM_END_S)
            return
        except TimeoutError:
            pass
        except BaseException:  # our own task was cancelled meanwhile
            call.cancel()
            raise
    call.cancel()
