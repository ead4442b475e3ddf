"""`inferwire` with every thread pool started full, for the soak's exact thread check:

    python -m tests.reliability.full_pools serve ...

ThreadPoolExecutor starts its workers lazily, when a task finds none idle, and keeps
them; how many a server has after a warm-up depends on how busy it happened to be. Here
every pool (the generation executor, asyncio's default executor) starts all of its
workers when it is made, so a thread more at the end of the soak is a thread leaked.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any

BARRIER_TIMEOUT_S = 30.0


class FullThreadPoolExecutor(concurrent.futures.ThreadPoolExecutor):
    """A ThreadPoolExecutor whose workers all start in its constructor."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Every worker blocks on the barrier until all have started: none is ever idle
        # while submitting, so each submit starts a new one, up to max_workers.
        barrier = threading.Barrier(self._max_workers + 1)
        for _ in range(self._max_workers):
            self.submit(barrier.wait, BARRIER_TIMEOUT_S)
        barrier.wait(BARRIER_TIMEOUT_S)


def main() -> None:
    # Before inferwire imports the class, and before asyncio makes its default executor.
    concurrent.futures.ThreadPoolExecutor = FullThreadPoolExecutor  # type: ignore[misc]
    from inferwire.cli import main as inferwire_main

    inferwire_main()


if __name__ == "__main__":
    main()
