"""A real DNS server on a loopback port (dnslib's, UDP and TCP) serving a zone tests rewrite.

`Zone.set(name, addresses)` changes what the server answers at once; a name the zone
does not hold gets NXDOMAIN, and `failing` makes every answer SERVFAIL. Records have
TTL 0, so nothing caches them.
"""

from __future__ import annotations

import ipaddress
import threading

from dnslib import AAAA, QTYPE, RCODE, RR, A, DNSRecord
from dnslib.server import BaseResolver, DNSHandler, DNSLogger, DNSServer


class Zone(BaseResolver):
    """Names and their addresses; a dnslib resolver."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: dict[str, tuple[str, ...]] = {}
        self.failing = False
        self.questions = 0

    def set(self, name: str, addresses: list[str]) -> None:
        with self._lock:
            self._names[name.rstrip(".") + "."] = tuple(addresses)

    def resolve(self, request: DNSRecord, handler: DNSHandler) -> DNSRecord:
        reply = request.reply()
        qname, qtype = request.q.qname, QTYPE[request.q.qtype]
        with self._lock:
            self.questions += 1
            addresses = self._names.get(str(qname))
            failing = self.failing
        if failing:
            reply.header.rcode = RCODE.SERVFAIL
        elif addresses is None:
            reply.header.rcode = RCODE.NXDOMAIN
        for address in addresses or ():
            version = ipaddress.ip_address(address).version
            if (qtype, version) == ("A", 4):
                reply.add_answer(RR(qname, QTYPE.A, rdata=A(address), ttl=0))
            elif (qtype, version) == ("AAAA", 6):
                reply.add_answer(RR(qname, QTYPE.AAAA, rdata=AAAA(address), ttl=0))
        return reply


class DnsServer:
    """`zone` served over UDP and TCP on 127.0.0.1, one port for both."""

    def __init__(self) -> None:
        self.zone = Zone()
        quiet = DNSLogger("-request,-reply,-truncated,-error,-recv,-send,-data", False)
        self._udp = DNSServer(self.zone, address="127.0.0.1", port=0, logger=quiet)
        self.port = self._udp.server.server_address[1]
        self._tcp = DNSServer(
            self.zone, address="127.0.0.1", port=self.port, tcp=True, logger=quiet
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self._udp.start_thread()
        self._tcp.start_thread()

    def stop(self) -> None:
        self._udp.stop()
        self._tcp.stop()
        self._udp.server.server_close()
        self._tcp.server.server_close()
