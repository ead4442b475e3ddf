"""The Triton servers' own KV-cache gauges, read from their metrics ports (`metrics_port`).

Two `tritonserver`s of this module's own, on 127.0.0.2 and 127.0.0.3 with one metrics
port for both (the option names one port for every host), serve the test model
`kv_gauge`, which reports TensorRT-LLM's `nv_trt_llm_kv_cache_block_metrics` through the
Python backend's metrics API, set by a `kv:<fraction>` prompt, and a copy of it named
`kv_gauge_neighbour` whose series the backend must not count. The backend is driven
directly; release() (not unload) ends each test, so the models stay loaded on Triton.
Timings are logged (`-o log_cli=true --log-cli-level=INFO`); the bounds are generous.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.triton import (
    REPOSITORY,
    SKIP_REASON,
    TRITON_DIR,
    TritonServer,
    all_running,
    free_port,
)

if TRITON_DIR is None:
    pytest.skip(SKIP_REASON, allow_module_level=True)

import numpy as np
import tritonclient.grpc as tritonclient

from inferwire.backends.triton import TritonBackend
from inferwire.backends.triton.kv_metrics import KV_POLL_INTERVAL_S, STALE_AFTER_INTERVALS

log = logging.getLogger(__name__)

MODEL = "kv_gauge"
NEIGHBOUR = "kv_gauge_neighbour"
ADDRESSES = ("127.0.0.2", "127.0.0.3")
# A new gauge value shows within a couple of poll intervals; the rest is slack for a fetch
# and for two shared CPUs.
FOLLOW_BOUND_S = 2 * KV_POLL_INTERVAL_S + 2.0
# A stopped endpoint: its reads time out (one interval each), and it is unknown at once.
STOPPED_BOUND_S = (STALE_AFTER_INTERVALS + 1) * KV_POLL_INTERVAL_S + 2.0
UNKNOWN = "Triton KV-cache usage unknown on an endpoint"


def kv_repository(directory: Path) -> Path:
    """kv_gauge, and the same model named NEIGHBOUR (symlinks copied as files)."""
    for name in (MODEL, NEIGHBOUR):
        shutil.copytree(REPOSITORY / MODEL, directory / name)
        config = directory / name / "config.pbtxt"
        config.write_text(config.read_text().replace(f'name: "{MODEL}"', f'name: "{name}"'))
    return directory


@pytest.fixture(scope="module")
def tritons(
    triton_dir: Path, record_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[TritonServer]]:
    repository = kv_repository(tmp_path_factory.mktemp("kv-repository"))
    metrics_port = free_port(*ADDRESSES)
    servers = [
        TritonServer(
            record_dir,
            load_models=(MODEL, NEIGHBOUR),
            repository=repository,
            address=address,
            metrics_port=metrics_port,
        )
        for address in ADDRESSES
    ]
    with all_running(servers):
        yield servers


def set_gauge(server: TritonServer, fraction: float, model: str = MODEL) -> None:
    """One request straight to Triton whose prompt sets the model's gauge."""
    client = tritonclient.InferenceServerClient(server.url)
    try:
        inputs = []
        for name, value, datatype in [
            ("text_input", np.array([[f"kv:{fraction} a".encode()]], dtype=np.object_), "BYTES"),
            ("max_tokens", np.array([[1]], dtype=np.int32), "INT32"),
        ]:
            tensor = tritonclient.InferInput(name, list(value.shape), datatype)
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        client.infer(model, inputs, timeout=30)
    finally:
        client.close()


async def set_gauges(*pairs: tuple[TritonServer, float]) -> None:
    await asyncio.gather(*(asyncio.to_thread(set_gauge, server, f) for server, f in pairs))


def backend_for(servers: list[TritonServer], **options: object) -> TritonBackend:
    urls = [server.url for server in servers]
    return TritonBackend("kv", {"urls": urls, "triton_model": MODEL, **options}, 4)


async def until_usage(backend: TritonBackend, wanted: float | None, bound_s: float) -> float:
    """Seconds until kv_cache_usage() is `wanted`; fails after `bound_s`."""
    since = time.monotonic()
    while True:
        usage = backend.kv_cache_usage()  # never raises, whatever the endpoints do
        if usage == wanted or (usage is not None and wanted is not None and _near(usage, wanted)):
            took = time.monotonic() - since
            log.info("kv_cache_usage() turned %s in %.2f s", wanted, took)
            return took
        assert time.monotonic() - since < bound_s, f"usage stayed {usage}, never {wanted}"
        await asyncio.sleep(0.02)


def _near(a: float, b: float) -> bool:
    return abs(a - b) < 1e-9


@contextlib.contextmanager
def stopped(server: TritonServer) -> Iterator[None]:
    """SIGSTOP the server (a hung Triton: its metrics port accepts, never answers)."""
    assert server.process is not None
    os.killpg(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.killpg(server.process.pid, signal.SIGCONT)


async def test_usage_follows_this_models_gauge_and_no_other(tritons):
    a = tritons[0]
    backend = backend_for([a], metrics_port=a.metrics_port)
    assert backend.kv_cache_usage() is None  # not loaded
    await backend.load()
    try:
        await set_gauges((a, 0.0))
        await until_usage(backend, 0.0, FOLLOW_BOUND_S)
        await asyncio.to_thread(set_gauge, a, 0.9, NEIGHBOUR)  # another model's cache
        await set_gauges((a, 0.25))
        await until_usage(backend, 0.25, FOLLOW_BOUND_S)
        await set_gauges((a, 0.75))
        await until_usage(backend, 0.75, FOLLOW_BOUND_S)
    finally:
        await backend.release()
        await asyncio.to_thread(set_gauge, a, 0.0, NEIGHBOUR)
    assert backend.kv_cache_usage() is None


async def test_without_metrics_port_usage_is_none(tritons):
    a = tritons[0]
    backend = backend_for([a])
    await backend.load()
    try:
        await set_gauges((a, 0.5))
        await asyncio.sleep(2 * KV_POLL_INTERVAL_S)
        assert backend.kv_cache_usage() is None
    finally:
        await backend.release()


async def test_with_two_endpoints_the_fuller_one_is_the_usage(tritons):
    a, b = tritons
    backend = backend_for(tritons, metrics_port=a.metrics_port)
    await backend.load()
    try:
        await set_gauges((a, 0.25), (b, 0.75))
        await until_usage(backend, 0.75, FOLLOW_BOUND_S)
        await set_gauges((a, 0.5), (b, 0.1))
        await until_usage(backend, 0.5, FOLLOW_BOUND_S)
    finally:
        await backend.release()


async def test_a_stopped_endpoint_leaves_the_other_then_none_and_nothing_raises(tritons, caplog):
    a, b = tritons
    backend = backend_for(tritons, metrics_port=a.metrics_port)
    await backend.load()
    try:
        await set_gauges((a, 0.8), (b, 0.3))
        await until_usage(backend, 0.8, FOLLOW_BOUND_S)
        with caplog.at_level(logging.WARNING, logger="inferwire.backends.triton"):
            with stopped(a):
                await until_usage(backend, 0.3, STOPPED_BOUND_S)
                with stopped(b):
                    await until_usage(backend, None, STOPPED_BOUND_S)
                    await asyncio.sleep(2 * KV_POLL_INTERVAL_S)  # more failed reads
                    assert backend.kv_cache_usage() is None
            await until_usage(backend, 0.8, STOPPED_BOUND_S)
        unknown = [r.metrics_url for r in caplog.records if r.getMessage() == UNKNOWN]
        assert sorted(unknown) == sorted(
            f"http://{s.address}:{s.metrics_port}/metrics" for s in tritons
        )
    finally:
        await backend.release()


async def test_a_port_nobody_listens_on_is_unknown_not_an_error(tritons):
    a = tritons[0]
    backend = backend_for([a], metrics_port=free_port(a.address))
    await backend.load()
    try:
        await set_gauges((a, 0.5))
        await asyncio.sleep(2 * KV_POLL_INTERVAL_S)
        assert backend.kv_cache_usage() is None
        assert (await backend.health()).healthy  # the model serves regardless
    finally:
        await backend.release()


def kv_tasks() -> list[asyncio.Task]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("triton-kv-")]


async def test_release_and_unload_stop_the_readings(tritons):
    a = tritons[0]
    backend = backend_for([a], metrics_port=a.metrics_port)
    await set_gauges((a, 0.4))
    for stop in (backend.release, backend.unload):
        await backend.load()
        await until_usage(backend, 0.4, FOLLOW_BOUND_S)
        assert len(kv_tasks()) == 1
        await stop()
        assert backend.kv_cache_usage() is None
        assert kv_tasks() == []
    # The unload unloaded kv_gauge on Triton: load it back for the tests after this one.
    await asyncio.to_thread(a.load_model, MODEL)
