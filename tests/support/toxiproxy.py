"""A real Toxiproxy (Shopify's TCP fault proxy) on 127.0.0.1, driven through its HTTP API.

`toxiproxy-server` comes from scripts/install_tools.sh (`make tools`) in .tools/bin. It
listens on 127.0.0.1 port 0 (the port is read back from /proc, as for tritonserver), and
so does every proxy: the API answers with the address a proxy got. Toxics are added to a
proxy's live connections as well as new ones, and removed the same way.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.triton import listening_port

TOOLS_BIN = Path(__file__).resolve().parents[2] / ".tools" / "bin"


def _server_binary() -> Path | None:
    installed = TOOLS_BIN / "toxiproxy-server"
    if installed.is_file():
        return installed
    found = shutil.which("toxiproxy-server")
    return Path(found) if found else None


TOXIPROXY_SERVER = _server_binary()
SKIP_REASON = "toxiproxy-server is not installed: make tools (scripts/install_tools.sh)"


@dataclass
class Proxy:
    """One proxy: clients connect to `listen`, it connects them on to `upstream`."""

    api: Toxiproxy
    name: str
    listen: str
    upstream: str

    def add(self, kind: str, stream: str = "downstream", **attributes: Any) -> str:
        """Add a toxic of `kind` on `stream` (downstream: towards the client); its name."""
        name = f"{kind}_{stream}"
        body = {"name": name, "type": kind, "stream": stream, "attributes": attributes}
        self.api.call("POST", f"/proxies/{self.name}/toxics", body)
        return name

    def remove(self, toxic: str) -> None:
        self.api.call("DELETE", f"/proxies/{self.name}/toxics/{toxic}")

    def toxics(self) -> list[str]:
        return [toxic["name"] for toxic in self.api.call("GET", f"/proxies/{self.name}/toxics")]

    def clear(self) -> None:
        """Remove every toxic: the link is perfect again."""
        for toxic in self.toxics():
            self.remove(toxic)


@dataclass
class Toxiproxy:
    """One `toxiproxy-server` process, in its own process group."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path

    @classmethod
    def start(cls, log_dir: Path) -> Toxiproxy:
        assert TOXIPROXY_SERVER is not None, SKIP_REASON
        log_path = log_dir / "toxiproxy.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                [str(TOXIPROXY_SERVER), "-host", "127.0.0.1", "-port", "0"],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        server = cls(process, 0, log_path)
        deadline = time.monotonic() + 30
        while not server.port or not server._answers():
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise AssertionError(f"toxiproxy did not start:\n{log_path.read_text()}")
            server.port = listening_port(process.pid)
            time.sleep(0.02)
        return server

    def _answers(self) -> bool:
        try:
            self.call("GET", "/version")
        except OSError:
            return False
        return True

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=data,
            method=method,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            text = response.read().decode()
        return json.loads(text) if text.strip().startswith(("{", "[")) else text

    def proxy(self, name: str, upstream: str) -> Proxy:
        """A new proxy on 127.0.0.1 port 0 in front of `upstream` (host:port)."""
        body = {"name": name, "listen": "127.0.0.1:0", "upstream": upstream, "enabled": True}
        created = self.call("POST", "/proxies", body)
        return Proxy(self, name, created["listen"], upstream)

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=10)
