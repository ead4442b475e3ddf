"""Network addresses written `host:port`, or `[IPv6]:port`: parsed and checked in one place.

A leaf module: it imports nothing of inferwire, so the configuration, the api, the core
and the backends may all use it.
"""

from __future__ import annotations

import re

# host:port, or [IPv6]:port (a zone, `%eth0`, allowed); the port's range is checked after.
_HOST_PORT = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.%\w]+)\]|(?P<host>[^:\[\]\s]+)):(?P<port>\d{1,5})$"
)
MAX_PORT = 65535


def split_host_port(address: str) -> tuple[str, int]:
    """`host:port` or `[v6]:port` as (host, port), an IPv6 host without its brackets.

    Raises ValueError for anything else: no port, a port above 65535, an IPv6 address
    without brackets (`::1:50051` is ambiguous).
    """
    match = _HOST_PORT.match(address)
    if match is None or int(match["port"]) > MAX_PORT:
        raise ValueError(f"{address!r} is not host:port")
    return match["v6"] or match["host"], int(match["port"])


def join_host_port(host: str, port: int) -> str:
    """`host:port`, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def is_unix_socket(address: str) -> bool:
    """Whether a listening address names a Unix domain socket (`unix:`, `unix-abstract:`)."""
    return address.startswith(("unix:", "unix-abstract:"))
