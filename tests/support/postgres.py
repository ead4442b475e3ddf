"""A throwaway PostgreSQL cluster from the machine's own binaries (Debian's `postgresql`
package: /usr/lib/postgresql/<version>/bin): `initdb` into a temporary directory, the
server on a free 127.0.0.1 port (its socket in that directory too), stopped by its PID.

initdb and postgres refuse to run as root: as root they run as the `postgres` user
(which the package creates) in a directory that user owns. Without the binaries a test
skips, saying why, unless INFERWIRE_REQUIRE_POSTGRES=1 (CI: .ci/run installs them), which
makes it fail.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

BINARIES = "/usr/lib/postgresql/*/bin/initdb"
SUPERUSER = "postgres"  # the cluster's, whoever runs it


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL's bin directory, if any."""
    found = sorted(Path("/").glob(BINARIES.lstrip("/")), key=lambda p: _version(p.parts[-3]))
    return found[-1].parent if found else None


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", text))


def require_postgres_bin() -> Path:
    """The bin directory, or skip (fail with INFERWIRE_REQUIRE_POSTGRES=1) saying why."""
    found = postgres_bin()
    if found is not None:
        return found
    reason = f"PostgreSQL is not installed here (no {BINARIES}; apt-get install postgresql)"
    if os.environ.get("INFERWIRE_REQUIRE_POSTGRES") == "1":
        pytest.fail(f"{reason}, and INFERWIRE_REQUIRE_POSTGRES=1", pytrace=False)
    pytest.skip(reason)


def _run_as() -> dict[str, Any]:
    """Popen's arguments that run a child as the `postgres` user when we are root."""
    if os.geteuid() != 0:
        return {}
    try:
        user = pwd.getpwnam("postgres")
    except KeyError:
        pytest.fail("running as root, and there is no `postgres` user to run PostgreSQL as")
    return {"user": user.pw_uid, "group": grp.getgrgid(user.pw_gid).gr_gid, "extra_groups": []}


def _free_port() -> int:
    """A port free now; postgres cannot bind port 0 and say which it took, so a start
    that finds it taken meanwhile tries another (PostgresCluster.start)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class PostgresCluster:
    """A cluster in `directory` (its data in `data/`, its socket and log beside it)."""

    bin: Path
    directory: Path
    port: int = 0  # 0 until started; kept, so that a restart listens where it did
    process: subprocess.Popen[bytes] | None = None
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.directory / "postgres.log"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def initdb(self) -> None:
        subprocess.run(
            [
                str(self.bin / "initdb"),
                "-D",
                str(self.directory / "data"),
                "-U",
                SUPERUSER,
                "--auth=trust",
                "--encoding=UTF8",
                "--locale=C",
                "--no-sync",
                "--no-instructions",
            ],
            cwd=self.directory,
            check=True,
            capture_output=True,
            **_run_as(),
        )

    def start(self, timeout_s: float = 60) -> None:
        """Start the server (on its port if it had one, else a free one) and wait until it
        takes connections."""
        for _ in range(5):
            port = self.port or _free_port()
            if self._start_on(port, timeout_s):
                self.port = port
                return
            if self.port:  # its own port, taken: nothing else to try
                break
        raise AssertionError(f"postgres did not start:\n{self.log.read_text()[-3000:]}")

    def _start_on(self, port: int, timeout_s: float) -> bool:
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(self.bin / "postgres"),
                    "-D",
                    str(self.directory / "data"),
                    "-p",
                    str(port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    f"unix_socket_directories={self.directory}",
                    "-c",
                    "fsync=off",  # a test's cluster: its durability is not what is tested
                ],
                cwd=self.directory,
                stdout=log,
                stderr=subprocess.STDOUT,
                **_run_as(),
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.process = None
                return False  # the log says why: a port taken is tried again
            with contextlib.suppress(psycopg.OperationalError):
                psycopg.connect(self._url_on(port), connect_timeout=2).close()
                return True
            time.sleep(0.1)
        self.stop()
        return False

    def _url_on(self, port: int) -> str:
        return f"postgresql://{SUPERUSER}@127.0.0.1:{port}/postgres"

    def stop(self) -> None:
        """A fast shutdown (SIGINT to its PID: sessions are ended), waited for."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)

    def execute(self, statement: str, database: str = "postgres") -> None:
        """Run one statement as the superuser."""
        with psycopg.connect(self.url(database), autocommit=True) as connection:
            connection.execute(statement.encode())


@contextlib.contextmanager
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A started cluster, stopped and removed at the end."""
    binaries = require_postgres_bin()
    directory = Path(tempfile.mkdtemp(prefix="inferwire-pg-"))
    cluster = PostgresCluster(binaries, directory)
    try:
        if os.geteuid() == 0:
            shutil.chown(directory, "postgres", grp.getgrgid(pwd.getpwnam("postgres").pw_gid)[0])
        cluster.initdb()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(directory, ignore_errors=True)
