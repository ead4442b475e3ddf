"""bench/cpu.py counts a server's child processes (the engine process) as its own CPU."""

from __future__ import annotations

import subprocess
import sys
import time

from bench.cpu import snapshot, usage_between

# A parent that starts a child burning 0.3 s of CPU and waits for it, idle itself.
_PARENT = """
import subprocess, sys
busy = "import time\\nend = time.process_time() + 0.3\\nwhile time.process_time() < end: pass"
child = subprocess.Popen([sys.executable, "-c", busy])
sys.stdout.write("started\\n"); sys.stdout.flush()
sys.stdin.readline()  # until the test has read the child's time
child.wait()
"""


def test_a_child_processs_cpu_counts_as_the_engine_process_group() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None and parent.stdin is not None
        assert parent.stdout.readline() == "started\n"
        assert not snapshot(parent.pid).child_threads  # only when asked for
        before = snapshot(parent.pid, children=True)
        deadline = time.monotonic() + 60
        # Until the child has burnt its 0.3 s (it stays a child: the parent waits for it).
        while (usage := usage_between(parent.pid, before, snapshot(parent.pid, True))).by_group[
            "engine_process"
        ] < 250_000:
            assert time.monotonic() < deadline, usage
            time.sleep(0.05)
        groups = usage.by_group
        assert groups["engine_process"] >= 250_000
        # The parent itself only waited.
        assert groups["event_loop"] < 100_000, groups
        parent.stdin.write("\n")
        parent.stdin.flush()
    finally:
        parent.wait(timeout=60)
