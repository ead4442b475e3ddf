"""health() only reports; the periodic endpoint check is what loads a lost model again.

The backend is driven directly, against a Triton of this module's own, so that nothing
but the backend under test loads or unloads models there.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.triton import SKIP_REASON, TRITON_DIR, TritonServer
from tests.support.waiting import wait_until

if TRITON_DIR is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

from inferwire.backends.triton import TritonBackend

MODEL = "vllm_echo"
# Generous: it fails a test only when the model never comes back.
BOUND_S = 30.0


@pytest.fixture(scope="module")
def triton(triton_dir: Path, record_dir: Path) -> Iterator[TritonServer]:
    with TritonServer(record_dir, load_models=(MODEL,)) as server:
        yield server


def backend_for(triton: TritonServer, **options: object) -> TritonBackend:
    return TritonBackend("echo", {"url": triton.url, "triton_model": MODEL, **options}, 1)


async def ready_on(triton: TritonServer) -> bool:
    return await asyncio.to_thread(triton.model_ready, MODEL)


async def unload_behind_its_back(triton: TritonServer) -> None:
    """As after a Triton restart: the backend has the model loaded, Triton does not."""
    await asyncio.to_thread(triton.unload_model, MODEL)


async def test_asking_for_health_loads_nothing_on_triton(triton):
    backend = backend_for(triton, health_interval_s=3600)  # no periodic check in this test
    await backend.load()
    try:
        await unload_behind_its_back(triton)
        for _ in range(3):
            health = await backend.health()
        # What the load found: health() asked Triton nothing, so it changed nothing there.
        assert health.healthy, health.detail
        assert not await ready_on(triton)
    finally:
        await backend.release()


async def test_the_periodic_check_loads_a_lost_model_again_until_unload(triton):
    backend = backend_for(triton, health_interval_s=0.1)
    await backend.load()
    try:
        await unload_behind_its_back(triton)
        await wait_until(lambda: ready_on(triton), timeout_s=BOUND_S, interval_s=0.05)

        async def healthy() -> bool:
            return (await backend.health()).healthy

        await wait_until(healthy, timeout_s=BOUND_S, interval_s=0.05)
    finally:
        await backend.unload()
    # The check stopped before the unload: several intervals on, nothing loaded it back.
    await asyncio.sleep(0.5)
    assert not await ready_on(triton)


async def test_without_reload_the_check_reports_the_lost_model_and_load_model_heals(triton):
    backend = backend_for(triton, health_interval_s=0.1, reload_lost_models=False)
    await backend.load()
    try:
        await unload_behind_its_back(triton)

        async def reported_lost() -> bool:
            health = await backend.health()
            return not health.healthy and "model not ready" in health.detail

        await wait_until(reported_lost, timeout_s=BOUND_S, interval_s=0.05)
        assert not await ready_on(triton)
        await backend.reconcile()  # what LoadModel on a READY model calls
        assert await ready_on(triton)
        assert (await backend.health()).healthy
    finally:
        await backend.release()
