"""The backend's background tasks (DNS resolution, the endpoint check): how they stop."""

from __future__ import annotations

import asyncio
import contextlib


async def stop_task(task: asyncio.Task[None] | None) -> None:
    """Cancel `task` and wait until it has ended; nothing to do for None."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
