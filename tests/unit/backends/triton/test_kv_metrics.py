"""The Triton servers' KV-cache gauges: the page parser, the HTTP read, the poller's rules.

The tests against real `tritonserver` metrics ports are tests/triton/test_triton_kv_metrics.py.
"""

import asyncio
import logging

import pytest

pytest.importorskip("tritonclient.grpc")

from pydantic import ValidationError
from tritonclient.grpc import model_config_pb2, service_pb2

from inferwire.backends.triton.conventions import describe_model
from inferwire.backends.triton.kv_metrics import (
    STALE_AFTER_INTERVALS,
    KvCachePoller,
    MetricsPageError,
    Reading,
    fetch_page,
    kv_usage,
)
from inferwire.backends.triton.options import TritonOptions

LOGGER = "inferwire.backends.triton"
UNKNOWN = "Triton KV-cache usage unknown on an endpoint"

# As Triton serves it with the TensorRT-LLM backend (labels sorted), among other families.
TRTLLM = "nv_trt_llm_kv_cache_block_metrics"
TRTLLM_PAGE = f"""\
# HELP nv_inference_request_success Number of successful inference requests
# TYPE nv_inference_request_success counter
nv_inference_request_success{{model="tensorrt_llm",version="1"}} 12
# HELP {TRTLLM} TRT LLM KV cache block metrics
# TYPE {TRTLLM} gauge
{TRTLLM}{{kv_cache_block_type="max",model="tensorrt_llm",version="1"}} 1000
{TRTLLM}{{kv_cache_block_type="used",model="tensorrt_llm",version="1"}} 400
{TRTLLM}{{kv_cache_block_type="fraction",model="tensorrt_llm",version="1"}} 0.4
{TRTLLM}{{kv_cache_block_type="fraction",model="other",version="1"}} 0.9
{TRTLLM}{{kv_cache_block_type="fraction",model="tensorrt_llm",version="2"}} 0.6
"""


def vllm_page(name: str, value: str, labels: str = 'model="vllm_model",version="1"') -> str:
    return (
        f"# HELP {name} GPU KV-cache usage. 1 means 100 percent usage.\n"
        f"# TYPE {name} gauge\n{name}{{{labels}}} {value}\n"
    )


def test_the_tensorrt_llm_fraction_of_this_model_is_read():
    assert kv_usage(TRTLLM_PAGE, "tensorrt_llm") == 0.6  # the highest of its versions
    assert kv_usage(TRTLLM_PAGE, "tensorrt_llm", version="1") == 0.4
    assert kv_usage(TRTLLM_PAGE, "other") == 0.9
    # Other models' gauges only: nothing known for this one.
    assert kv_usage(TRTLLM_PAGE, "ensemble") is None
    # An ensemble's step counts, whatever its version (the option names the ensemble's).
    assert kv_usage(TRTLLM_PAGE, "ensemble", ("preprocessing", "tensorrt_llm"), "1") == 0.6


@pytest.mark.parametrize("name", ["vllm:gpu_cache_usage_perc", "vllm:kv_cache_usage_perc"])
def test_the_vllm_backends_gauge_is_read_by_either_name(name):
    assert kv_usage(vllm_page(name, "0.25"), "vllm_model") == 0.25
    assert kv_usage(vllm_page(name, "0.25"), "vllm_model", version="2") is None
    assert kv_usage(vllm_page(name, "0.25"), "llama") is None


def test_a_series_without_model_label_counts_and_values_are_kept_to_0_to_1():
    page = vllm_page("vllm:kv_cache_usage_perc", "0.3", labels='engine="0"')
    assert kv_usage(page, "anything") == 0.3
    assert kv_usage(vllm_page("vllm:gpu_cache_usage_perc", "1.5"), "vllm_model") == 1.0
    assert kv_usage(vllm_page("vllm:gpu_cache_usage_perc", "-0.1"), "vllm_model") == 0.0
    assert kv_usage(vllm_page("vllm:gpu_cache_usage_perc", "NaN"), "vllm_model") is None


def test_a_page_without_the_gauges_knows_nothing_and_broken_text_is_an_error():
    assert kv_usage("", "m") is None
    assert kv_usage('nv_gpu_utilization{gpu_uuid="GPU-1"} 0.5\n', "m") is None
    with pytest.raises(ValueError):
        kv_usage('vllm:kv_cache_usage_perc{model="m" 0.5\n', "m")


def test_an_ensembles_steps_are_the_models_whose_gauges_count():
    metadata = service_pb2.ModelMetadataResponse()
    metadata.inputs.add(name="text_input", datatype="BYTES", shape=[-1])
    metadata.inputs.add(name="max_tokens", datatype="INT32", shape=[-1])
    metadata.outputs.add(name="text_output", datatype="BYTES", shape=[-1])
    config = model_config_pb2.ModelConfig(max_batch_size=8)
    for step in ("preprocessing", "tensorrt_llm", "postprocessing", "tensorrt_llm"):
        config.ensemble_scheduling.step.add(model_name=step)
    layout = describe_model(
        metadata, config, choice="auto", has_tokenizer=False, triton_model="ensemble"
    )
    assert layout.steps == ("preprocessing", "tensorrt_llm", "postprocessing")


def test_metrics_port_is_a_port_and_needs_host_port_urls():
    assert TritonOptions(url="triton:8001", metrics_port=8002).metrics_port == 8002
    assert TritonOptions(url="triton:8001").metrics_port is None
    for port in (0, 65536):
        with pytest.raises(ValidationError, match="metrics_port"):
            TritonOptions(url="triton:8001", metrics_port=port)
    with pytest.raises(ValueError, match="host:port"):
        TritonOptions(url="triton", metrics_port=8002)


# ---- the HTTP read ---------------------------------------------------------------


async def serve(answer: bytes | None):
    """A one-page HTTP server on 127.0.0.1:0; None: it accepts and never answers."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if answer is None:
            await asyncio.sleep(3600)
        writer.write(answer)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_metrics_page_is_read_over_http():
    body = vllm_page("vllm:gpu_cache_usage_perc", "0.5").encode()
    head = f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    server, port = await serve(head.encode() + body)
    async with server:
        assert await fetch_page("127.0.0.1", port, 1.0) == body.decode()


async def test_a_status_other_than_200_a_refusal_and_silence_are_errors():
    server, port = await serve(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
    async with server:
        with pytest.raises(MetricsPageError, match="404"):
            await fetch_page("127.0.0.1", port, 1.0)
    with pytest.raises(OSError):  # nobody listens there any more
        await fetch_page("127.0.0.1", port, 1.0)
    server, port = await serve(None)
    async with server:
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(TimeoutError):
            await fetch_page("127.0.0.1", port, 0.2)
        assert loop.time() - started < 2


# ---- the poller --------------------------------------------------------------------


class FakeMetrics:
    """Answers each host's page from `pages`; an exception there is raised instead."""

    def __init__(self) -> None:
        self.pages: dict[str, str | Exception] = {}
        self.asked: list[tuple[str, int]] = []

    async def __call__(self, host: str, port: int, timeout: float) -> str:
        self.asked.append((host, port))
        page = self.pages[host]
        if isinstance(page, Exception):
            raise page
        return page

    def gauge(self, host: str, fraction: float) -> None:
        self.pages[host] = vllm_page("vllm:gpu_cache_usage_perc", str(fraction))


def poller(urls: list[str], fetch: FakeMetrics) -> KvCachePoller:
    return KvCachePoller("llama", lambda: urls, 8002, "vllm_model", fetch=fetch)


async def test_the_fullest_endpoint_that_answered_is_the_usage():
    fetch = FakeMetrics()
    urls = ["10.0.0.1:8001", "10.0.0.2:8001", "10.0.0.2:9001"]  # two servers on one host
    kv = poller(urls, fetch)
    assert kv.usage() is None  # nothing read yet
    fetch.gauge("10.0.0.1", 0.25)
    fetch.gauge("10.0.0.2", 0.75)
    await kv.poll()
    assert kv.usage() == 0.75
    assert sorted(fetch.asked) == [("10.0.0.1", 8002), ("10.0.0.2", 8002)]  # each host once
    fetch.pages["10.0.0.2"] = ConnectionRefusedError(111, "Connection refused")
    await kv.poll()
    assert kv.usage() == 0.25  # the one that answered
    fetch.pages["10.0.0.1"] = TimeoutError()
    await kv.poll()
    assert kv.usage() is None


async def test_a_failing_endpoint_is_logged_once_and_its_recovery_once(caplog):
    fetch = FakeMetrics()
    kv = poller(["10.0.0.1:8001", "10.0.0.2:8001"], fetch)
    fetch.gauge("10.0.0.1", 0.5)
    fetch.pages["10.0.0.2"] = TimeoutError()
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            await kv.poll()
        fetch.pages["10.0.0.2"] = "# a page without the gauge\n"
        await kv.poll()  # still unknown there: not logged again
        fetch.gauge("10.0.0.2", 0.5)
        await kv.poll()
        await kv.poll()
    records = [(r.getMessage(), getattr(r, "metrics_url", None)) for r in caplog.records]
    assert records == [
        (UNKNOWN, "http://10.0.0.2:8002/metrics"),
        ("Triton KV-cache metrics readable again", "http://10.0.0.2:8002/metrics"),
    ]
    assert "timed out" in caplog.records[0].error


async def test_a_page_without_the_gauge_is_unknown_and_logged_once(caplog):
    fetch = FakeMetrics()
    fetch.pages["10.0.0.1"] = vllm_page("vllm:gpu_cache_usage_perc", "0.5", 'model="other"')
    kv = poller(["10.0.0.1:8001"], fetch)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        await kv.poll()
        await kv.poll()
    assert kv.usage() is None
    assert [r.getMessage() for r in caplog.records] == [UNKNOWN]
    assert "no KV-cache gauge" in caplog.records[0].error


async def test_an_old_reading_no_longer_counts_and_gone_endpoints_are_forgotten():
    fetch = FakeMetrics()
    urls = ["10.0.0.1:8001", "10.0.0.2:8001"]
    kv = poller(urls, fetch)
    fetch.gauge("10.0.0.1", 0.25)
    fetch.gauge("10.0.0.2", 0.75)
    await kv.poll()
    answered = kv.readings["10.0.0.2:8002"].at
    stale = answered - STALE_AFTER_INTERVALS * kv.interval_s - 0.1
    kv.readings["10.0.0.2:8002"] = Reading(0.75, stale)  # as if it stopped answering long ago
    assert kv.usage() == 0.25
    urls.remove("10.0.0.1:8001")  # e.g. gone from DNS
    await kv.poll()
    assert set(kv.readings) == {"10.0.0.2:8002"}
    assert kv.usage() == 0.75


async def test_the_task_reads_until_stopped_and_a_stopped_poller_knows_nothing():
    fetch = FakeMetrics()
    fetch.gauge("10.0.0.1", 0.5)
    urls = ["10.0.0.1:8001"]
    kv = KvCachePoller("llama", lambda: urls, 8002, "vllm_model", interval_s=0.01, fetch=fetch)
    kv.start()
    while len(fetch.asked) < 3:
        await asyncio.sleep(0.01)
    assert kv.usage() == 0.5
    await kv.stop()
    asked = len(fetch.asked)
    await asyncio.sleep(0.05)
    assert len(fetch.asked) == asked
    assert kv.usage() is None
