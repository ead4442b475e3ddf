"""Triton endpoints discovered from DNS (`discovery: dns`), e.g. a Kubernetes headless Service.

Each configured `host:port` is resolved to all its addresses (A and AAAA); every
address is one endpoint with its own channel. A small task owned by the backend
resolves again every `dns_refresh_s`, and sooner (rate-limited) when requests find no
usable endpoint, and hands each new set of addresses to the backend, which loads the
model on new addresses and drains the ones that went away.

A name that does not exist or has no address counts as an empty answer: the model then
has no endpoint. Any other failure (timeout, SERVFAIL, no server) keeps the last good
set, and is logged once per change of the error, not once per resolution.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

import dns.asyncresolver
import dns.exception
import dns.resolver

from inferwire.addresses import join_host_port, split_host_port
from inferwire.backends.triton.options import TritonOptions
from inferwire.backends.triton.tasks import stop_task
from inferwire.core.errors import BackendUnavailableError

log = logging.getLogger(__package__)

# The shortest gap between two early re-resolutions that requests ask for.
_EARLY_GAP_S = 1.0


class DiscoveryError(BackendUnavailableError):
    """The DNS server could not answer (not an empty answer)."""


@dataclass(frozen=True)
class Change:
    """How a resolved set of endpoints differs from the current one."""

    added: tuple[str, ...]
    removed: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed)


def diff(current: Iterable[str], resolved: Iterable[str]) -> Change:
    """The endpoints to add and those to drain, each sorted."""
    now, then = set(resolved), set(current)
    return Change(tuple(sorted(now - then)), tuple(sorted(then - now)))


class ResolutionLog:
    """Logs resolution failures once per change of the error, and the recovery once."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.error: str | None = None

    def failed(self, error: str) -> bool:
        """Note a failure; return whether it was logged (a new error)."""
        if error == self.error:
            return False
        self.error = error
        log.warning(
            "DNS resolution of Triton endpoints failed; keeping the last good set",
            extra={"model": self.model_name, "error": error},
        )
        return True

    def succeeded(self) -> bool:
        """Note a success; return whether it was logged (the end of a failure)."""
        if self.error is None:
            return False
        self.error = None
        log.info("DNS resolution of Triton endpoints works again", extra={"model": self.model_name})
        return True


class DnsDiscovery:
    """Resolves the configured names; a task hands each new set of endpoints to `apply`."""

    def __init__(
        self,
        model_name: str,
        options: TritonOptions,
        apply: Callable[[set[str]], Awaitable[None]],
    ) -> None:
        self.options = options
        self.names = [split_host_port(url) for url in options.endpoints]
        self.apply = apply
        self.log = ResolutionLog(model_name)
        self._resolver = dns.asyncresolver.Resolver(configure=options.dns_server is None)
        if options.dns_server is not None:
            host, port = split_host_port(options.dns_server)
            self._resolver.nameservers = [host]
            self._resolver.port = port
        self._resolver.lifetime = max(1.0, min(options.dns_refresh_s, 5.0))
        self._wake = asyncio.Event()
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None

    async def resolve(self) -> set[str]:
        """Every address of every name, as endpoint urls; DiscoveryError if DNS fails."""
        self._last = time.monotonic()
        asked = [(host, port, kind) for host, port in self.names for kind in ("A", "AAAA")]
        answers = await asyncio.gather(*(self._addresses(host, kind) for host, _, kind in asked))
        return {
            join_host_port(address, port)
            for (_, port, _), found in zip(asked, answers, strict=True)
            for address in found
        }

    async def _addresses(self, host: str, kind: str) -> list[str]:
        with contextlib.suppress(ValueError):
            address = ipaddress.ip_address(host)  # a literal address resolves to itself
            return [str(address)] if (address.version == 4) == (kind == "A") else []
        try:
            answer = await self._resolver.resolve(host, kind, search=False)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer):
            return []
        except dns.exception.DNSException as exc:
            raise DiscoveryError(f"resolving {host} ({kind}): {exc}") from None
        return [record.address for record in answer]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="triton-dns-discovery")

    async def stop(self) -> None:
        task, self._task = self._task, None
        await stop_task(task)

    def refresh_soon(self) -> None:
        """Resolve again now, unless the last resolution was less than a moment ago."""
        if time.monotonic() - self._last >= min(_EARLY_GAP_S, self.options.dns_refresh_s):
            self._wake.set()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.options.dns_refresh_s)
            self._wake.clear()
            try:
                resolved = await self.resolve()
            except DiscoveryError as exc:
                self.log.failed(str(exc))
                continue
            self.log.succeeded()
            try:
                await self.apply(resolved)
            except Exception:
                log.exception("applying DNS-discovered Triton endpoints failed")
