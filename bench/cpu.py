"""CPU time of a process, split by thread, read from /proc; and the machine's quiet check.

CPU time is far steadier than wall time on a shared machine, so every scenario that
compares a path with a baseline reports CPU per unit of work next to throughput.

Per-thread time comes from /proc/<pid>/task/<tid>/schedstat (nanoseconds on the CPU);
the process total from /proc/<pid>/stat (clock ticks, and it keeps the time of threads
that have exited). Threads are grouped by what they do:
- `event_loop`: the main thread (tid == pid), where grpc.aio and the servicer run;
- `log`: inferwire's log writer (`iw-log`, inferwire/log.py), which formats and writes lines;
- `engine`: the other threads inferwire names `iw-*` (the engine scheduler, generator workers);
- `grpc`: gRPC core's own threads (it names them);
- `other`: everything else alive at the end, e.g. ONNX Runtime's intra-op pool;
- `engine_process`: with `children`, every thread of the process's children (the engine
  process of `engine_process: true`), so a server's CPU includes what it moved out of its
  process (a bench process leaves its children, the servers it runs, out);
- `exited`: the process total less the threads still alive (threads that ended mid-run).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
_GRPC_THREAD_PREFIXES = ("grpc", "default-executo", "resolver-execu", "event_engine", "timer")
GROUPS = ("event_loop", "engine", "log", "grpc", "other", "engine_process", "exited")
_LOG_WRITER = "iw-log"
QUIET_LOAD_PER_CPU = 0.5  # the rule for a reference result


@dataclass(frozen=True)
class CpuSnapshot:
    """One reading of a process: its total CPU and each live thread's (ns)."""

    total_ns: float
    threads: dict[int, tuple[str, int]]  # tid -> (name, ns on the CPU)
    child_threads: frozenset[int] = frozenset()  # tids of the children's threads


def _thread_ns(task: Path) -> tuple[str, int] | None:
    try:
        name = (task / "comm").read_text().strip()
        on_cpu_ns = int((task / "schedstat").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None  # the thread ended while we read
    return name, on_cpu_ns


def snapshot(pid: int, children: bool = False) -> CpuSnapshot:
    """The process, and with `children` its children (whose CPU its own total leaves out)."""
    total_ns, threads = _process(pid)
    child_threads: set[int] = set()
    for child in _children(pid) if children else []:
        try:
            child_ns, child_tasks = _process(child)
        except OSError:
            continue  # it ended while we read
        total_ns += child_ns
        threads.update(child_tasks)
        child_threads.update(child_tasks)
    return CpuSnapshot(total_ns, threads, frozenset(child_threads))


def _process(pid: int) -> tuple[float, dict[int, tuple[str, int]]]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    total_ns = (int(fields[11]) + int(fields[12])) * _TICK_NS  # utime + stime
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        reading = _thread_ns(task)
        if reading is not None:
            threads[int(task.name)] = reading
    return total_ns, threads


def _children(pid: int) -> list[int]:
    children: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            children.extend(int(c) for c in (task / "children").read_text().split())
        except (OSError, ValueError):
            continue
    return children


def group_of(pid: int, tid: int, name: str) -> str:
    if tid == pid:
        return "event_loop"
    if name == _LOG_WRITER:
        return "log"
    if name.startswith("iw-"):
        return "engine"
    if name.startswith(_GRPC_THREAD_PREFIXES):
        return "grpc"
    return "other"


@dataclass
class CpuUsage:
    """CPU used between two snapshots, in microseconds, total and by thread group."""

    total_us: float
    by_group: dict[str, float] = field(default_factory=dict)

    def per(self, units: float) -> dict[str, float]:
        """µs per unit of work (token, request), total and by group."""
        if not units:
            return {"total": 0.0, **{g: 0.0 for g in self.by_group}}
        return {
            "total": self.total_us / units,
            **{group: us / units for group, us in self.by_group.items()},
        }


def usage_between(pid: int, before: CpuSnapshot, after: CpuSnapshot) -> CpuUsage:
    by_group = dict.fromkeys(GROUPS, 0.0)
    live_ns = 0.0
    for tid, (name, ns) in after.threads.items():
        spent = ns - before.threads.get(tid, (name, 0))[1]
        live_ns += spent
        group = "engine_process" if tid in after.child_threads else group_of(pid, tid, name)
        by_group[group] += spent / 1e3
    total_ns = after.total_ns - before.total_ns
    # Ticks are coarse (10 ms), and each of the two readings may be off by one: only what
    # the process total exceeds the live threads' nanoseconds by beyond that is exited
    # threads' time. (Taking the larger of the two totals made a short run of a one-thread
    # floor server read up to a tick high: 12 to 34 µs per event on the same server.)
    by_group["exited"] = max(0.0, total_ns - live_ns - 2 * _TICK_NS) / 1e3
    return CpuUsage(live_ns / 1e3 + by_group["exited"], by_group)


class CpuMeter:
    """`with CpuMeter(pid) as meter: ...`; then `meter.usage`; `children`: theirs too."""

    def __init__(self, pid: int, children: bool = False) -> None:
        self.pid = pid
        self.children = children
        self.usage = CpuUsage(0.0)
        self._before: CpuSnapshot | None = None

    def __enter__(self) -> CpuMeter:
        self._before = snapshot(self.pid, self.children)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        assert self._before is not None
        self.usage = usage_between(self.pid, self._before, snapshot(self.pid, self.children))


def load_per_cpu() -> float:
    """The 1-minute load average per usable CPU."""
    return os.getloadavg()[0] / len(os.sched_getaffinity(0))


def wait_until_quiet(timeout_s: float, limit: float = QUIET_LOAD_PER_CPU) -> float:
    """Wait (up to timeout_s) for the load per CPU to fall to `limit`; the last reading."""
    deadline = time.monotonic() + timeout_s
    load = load_per_cpu()
    while load > limit and time.monotonic() < deadline:
        time.sleep(5)
        load = load_per_cpu()
    return load
