"""The Triton servers' own KV-cache usage, read from their metrics ports (`metrics_port`).

While the model is loaded, a task owned by the backend fetches
`http://<host of each endpoint>:<metrics_port>/metrics` every `KV_POLL_INTERVAL_S`
(all endpoints at once, each fetch bounded by the interval), and keeps each endpoint's
latest KV-cache usage fraction. `KvCachePoller.usage()` is what the backend's
`kv_cache_usage()` returns: the highest fraction over the endpoints that answered within
`STALE_AFTER_INTERVALS` intervals, since a request may land on any endpoint and the
fullest one limits new work. No I/O there: it is read at every metrics scrape.

The gauges read, from the Prometheus text Triton serves:
- TensorRT-LLM backend: `nv_trt_llm_kv_cache_block_metrics{kv_cache_block_type="fraction"}`
  (the fraction of KV-cache blocks in use, 0 to 1; labelled `model` with the
  `tensorrt_llm` model's name, and `version`);
- vLLM backend: `vllm:gpu_cache_usage_perc` (what Triton's vLLM backend exports, 1 = 100 %),
  and `vllm:kv_cache_usage_perc` (vLLM's own current name for it).
Only series of the model's own Triton models count: a series with a `model` label must
name the served model or, for an ensemble, one of its steps; a series of the served model
with a `version` label must name the configured `version`, when one is set (a step's
versions are its own).

A failed fetch (refused, timed out, not 200, not Prometheus text) makes that endpoint's
usage unknown; it is logged once when the endpoint starts failing and once when it
answers again, and never reaches a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from inferwire.addresses import join_host_port, split_host_port
from inferwire.backends.triton.options import TritonOptions
from inferwire.backends.triton.tasks import stop_task

log = logging.getLogger(__package__)

# Seconds between two reads of every endpoint's metrics page; also each read's timeout.
KV_POLL_INTERVAL_S = 1.0
# An endpoint's last reading counts for this many intervals, then it is unknown.
STALE_AFTER_INTERVALS = 3
# A metrics page larger than this is refused (a Triton page lists every model's metrics).
MAX_PAGE_BYTES = 16 * 2**20

TRTLLM_FAMILY = "nv_trt_llm_kv_cache_block_metrics"
TRTLLM_KIND_LABEL, TRTLLM_FRACTION = "kv_cache_block_type", "fraction"
VLLM_FAMILIES = ("vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc")
_FAMILIES = (TRTLLM_FAMILY, *VLLM_FAMILIES)
# The lines of those families on a page: their samples and their HELP and TYPE comments.
_LINE_PREFIXES = tuple(
    prefix
    for family in _FAMILIES
    for prefix in (f"{family}{{", f"{family} ", f"# HELP {family} ", f"# TYPE {family} ")
)

Fetch = Callable[[str, int, float], Awaitable[str]]


class MetricsPageError(Exception):
    """A metrics endpoint answered, but not with a metrics page."""


def kv_usage(page: str, model: str, steps: Collection[str] = (), version: str = "") -> float | None:
    """The highest KV-cache usage fraction on a Prometheus text page for `model` (its
    `version`, when not empty) or its ensemble `steps`; None when the page has none.
    ValueError: not Prometheus text."""
    # Only the families read go to the parser: a page lists every model's metrics.
    lines = [line for line in page.splitlines() if line.startswith(_LINE_PREFIXES)]
    fractions = []
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            labels = sample.labels
            if sample.name not in _FAMILIES:
                continue
            if sample.name == TRTLLM_FAMILY and labels.get(TRTLLM_KIND_LABEL) != TRTLLM_FRACTION:
                continue
            named = labels.get("model")
            if named is not None and named != model and named not in steps:
                continue
            if version and named == model and labels.get("version", version) != version:
                continue
            if math.isfinite(sample.value):
                fractions.append(min(1.0, max(0.0, float(sample.value))))
    return max(fractions, default=None)


async def fetch_page(host: str, port: int, timeout: float) -> str:
    """The text of `http://host:port/metrics`, within `timeout` seconds in all."""
    address = join_host_port(host, port)
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port, limit=2**16)
        try:
            # HTTP/1.0: the page comes whole, then the server closes (no chunks).
            request = f"GET /metrics HTTP/1.0\r\nHost: {address}\r\nAccept: text/plain\r\n\r\n"
            writer.write(request.encode())
            await writer.drain()
            head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
            status = head.split("\r\n", 1)[0]
            if status.split(" ")[1:2] != ["200"]:
                raise MetricsPageError(f"answered {status!r}")
            if "transfer-encoding: chunked" in head.lower():
                raise MetricsPageError("answered in chunks to an HTTP/1.0 request")
            body = bytearray()
            while chunk := await reader.read(2**16):
                body += chunk
                if len(body) > MAX_PAGE_BYTES:
                    raise MetricsPageError(f"page larger than {MAX_PAGE_BYTES} bytes")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
    return body.decode("utf-8", errors="replace")


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, asyncio.IncompleteReadError):
        return "closed the connection before a whole answer"
    return f"{type(exc).__name__}: {exc}" if not isinstance(exc, MetricsPageError) else str(exc)


@dataclass(frozen=True)
class Reading:
    """What one metrics endpoint reported last: its fraction (None: no gauge for the
    model) and when (time.monotonic())."""

    fraction: float | None
    at: float


class KvCachePoller:
    """Reads the KV-cache usage of one model on the metrics ports of its endpoints."""

    def __init__(
        self,
        model_name: str,
        urls: Callable[[], Iterable[str]],
        port: int,
        model: str,
        steps: Collection[str] = (),
        version: str = "",
        interval_s: float = KV_POLL_INTERVAL_S,
        fetch: Fetch = fetch_page,
    ) -> None:
        self.model_name = model_name
        self._urls = urls  # the endpoints' gRPC urls, asked again before every round
        self.port = port
        self.model = model  # the Triton model's name, and its ensemble's steps
        self.steps = tuple(steps)
        self.version = version
        self.interval_s = interval_s
        self._fetch = fetch
        self.readings: dict[str, Reading] = {}  # by metrics address, host:port
        self._trouble: set[str] = set()  # addresses whose last read failed or had no gauge
        self._task: asyncio.Task[None] | None = None

    @classmethod
    def started(
        cls,
        model_name: str,
        options: TritonOptions,
        urls: Callable[[], Iterable[str]],
        model: str,
        steps: Collection[str],
    ) -> KvCachePoller | None:
        """A running poller of the gauges of `model` (or of its ensemble `steps`) on the
        metrics port of every endpoint in `urls()`; None without options.metrics_port."""
        if options.metrics_port is None:
            return None
        poller = cls(model_name, urls, options.metrics_port, model, steps, options.version)
        poller.start()
        return poller

    def usage(self) -> float | None:
        """The highest fraction read recently from any endpoint; None: none known. No I/O."""
        fresh_since = time.monotonic() - STALE_AFTER_INTERVALS * self.interval_s
        known = [
            r.fraction
            for r in self.readings.values()
            if r.fraction is not None and r.at >= fresh_since
        ]
        return max(known, default=None)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=f"triton-kv-{self.model_name}")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)
        self.readings.clear()

    def targets(self) -> list[tuple[str, int]]:
        """The metrics endpoints: the host of every endpoint, once, with `port`."""
        hosts = dict.fromkeys(split_host_port(url)[0] for url in self._urls())
        return [(host, self.port) for host in hosts]

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            try:
                await self.poll()
            except Exception:  # a bug here must not end the readings for good
                log.exception("reading Triton KV-cache metrics failed", extra=self._extra())
            await asyncio.sleep(max(0.0, self.interval_s - (time.monotonic() - started)))

    async def poll(self) -> None:
        """Read every metrics endpoint once, concurrently; forget the ones now gone."""
        targets = self.targets()
        addresses = {join_host_port(host, port) for host, port in targets}
        for gone in set(self.readings) - addresses:
            del self.readings[gone]
        self._trouble &= addresses
        await asyncio.gather(*(self._poll_one(host, port) for host, port in targets))

    async def _poll_one(self, host: str, port: int) -> None:
        address = join_host_port(host, port)
        try:
            page = await self._fetch(host, port, self.interval_s)
            fraction = kv_usage(page, self.model, self.steps, self.version)
        except Exception as exc:  # whatever went wrong, the endpoint's usage is unknown
            self.readings.pop(address, None)
            self._note_trouble(address, f"metrics at {address} unreadable: {_reason(exc)}")
            return
        self.readings[address] = Reading(fraction, time.monotonic())
        if fraction is None:
            self._note_trouble(address, f"metrics at {address} have no KV-cache gauge for it")
        elif address in self._trouble:
            self._trouble.discard(address)
            log.info("Triton KV-cache metrics readable again", extra=self._extra(address))

    def _note_trouble(self, address: str, problem: str) -> None:
        """Log a problem with one endpoint once, until it reports a fraction again."""
        if address not in self._trouble:
            self._trouble.add(address)
            log.warning(
                "Triton KV-cache usage unknown on an endpoint",
                extra={**self._extra(address), "error": problem},
            )

    def _extra(self, address: str | None = None) -> dict[str, object]:
        extra: dict[str, object] = {"model": self.model_name, "triton_model": self.model}
        if address is not None:
            extra["metrics_url"] = f"http://{address}/metrics"
        return extra
