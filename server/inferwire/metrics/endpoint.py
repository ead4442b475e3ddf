"""`/metrics` on its own port (`server.metrics_address`): the server's registry, in a thread."""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CollectorRegistry, start_http_server

from inferwire.addresses import split_host_port

log = logging.getLogger(__name__)


class MetricsEndpoint:
    """`/metrics` over HTTP on `address` (host:port; port 0 picks a free one)."""

    def __init__(self, address: str, registry: CollectorRegistry) -> None:
        self.address = address
        self._registry = registry
        self._served: tuple[Any, Any] | None = None

    def start(self) -> int:
        """Serve in a thread; returns the bound port. Raises OSError when it cannot bind."""
        host, port = split_host_port(self.address)
        try:
            self._served = start_http_server(port, host, self._registry)
        except OSError as error:
            raise OSError(
                f"server.metrics_address: could not serve metrics on {self.address}: "
                f"{error.strerror or error}"
            ) from None
        bound: int = self._served[0].server_port
        log.info("metrics listening", extra={"address": self.address, "port": bound})
        return bound

    def stop(self) -> None:
        if self._served is None:
            return
        server, thread = self._served
        self._served = None
        server.shutdown()
        server.server_close()
        thread.join()
