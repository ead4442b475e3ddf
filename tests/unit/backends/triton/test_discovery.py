"""DNS discovery's pure parts: diffing resolved sets, drain bookkeeping, once-per-change logs."""

import logging

import pytest

pytest.importorskip("tritonclient.grpc")
pytest.importorskip("dns.asyncresolver")

from inferwire.addresses import join_host_port, split_host_port
from inferwire.backends.triton.discovery import Change, ResolutionLog, diff
from inferwire.backends.triton.endpoints import EndpointPool
from inferwire.backends.triton.options import TritonOptions


def test_diff_names_new_and_gone_endpoints_sorted():
    change = diff({"10.0.0.1:8001", "10.0.0.2:8001"}, ["10.0.0.3:8001", "10.0.0.1:8001"])
    assert change == Change(added=("10.0.0.3:8001",), removed=("10.0.0.2:8001",))
    assert not diff(["a:1"], {"a:1"})
    assert diff([], []) == Change((), ())


def test_urls_of_v4_and_v6_addresses_round_trip():
    assert join_host_port("10.0.0.1", 8001) == "10.0.0.1:8001"
    assert join_host_port("fd00::1", 8001) == "[fd00::1]:8001"
    assert split_host_port("[fd00::1]:8001") == ("fd00::1", 8001)
    assert split_host_port("triton.ns.svc:8001") == ("triton.ns.svc", 8001)


def test_dns_options_need_host_and_port():
    with pytest.raises(ValueError, match="host:port"):
        TritonOptions(discovery="dns", urls=["triton"])
    with pytest.raises(ValueError, match="discovery: dns"):
        TritonOptions(urls=["triton:8001"], dns_server="127.0.0.1:53")


def test_a_failure_is_logged_once_per_change_and_the_recovery_once(caplog):
    record = ResolutionLog("llama")
    with caplog.at_level(logging.INFO, logger="inferwire.backends.triton"):
        assert record.failed("timeout")
        assert not record.failed("timeout")
        assert record.failed("SERVFAIL")
        assert record.succeeded()
        assert not record.succeeded()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 3
    assert record.error is None


async def test_a_drained_endpoint_leaves_the_rotation_at_once_and_closes_once_idle():
    pool = EndpointPool("llama", "llama-3", TritonOptions(urls=["127.0.0.1:1", "127.0.0.1:2"]))
    await pool.open()
    try:
        first, second = pool.endpoints
        first.in_flight = 1  # a stream still running there
        pool.drain(first.url)
        assert [pool.pick().url for _ in range(3)] == [second.url] * 3
        assert pool.draining == [first] and first.draining
        assert pool.urls == {second.url}
        with pool._in_flight(first):  # the stream's last moments
            first.in_flight -= 1
        assert pool.draining == []  # closing now
        joining = pool.add("127.0.0.1:3")
        assert pool.urls == {second.url, joining.url}
        assert [pool.pick().url for _ in range(2)] == [second.url] * 2  # not admitted yet
        joining.healthy = True  # as its health check found
        pool.admit(joining)
        assert {pool.pick().url for _ in range(2)} == {second.url, joining.url}
        pool.drain("127.0.0.1:9")  # unknown: nothing happens
    finally:
        await pool.close()
    assert pool.endpoints == [] and pool.joining == {} and pool.draining == []
