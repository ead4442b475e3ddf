"""`host:port` and `[v6]:port`, the one parser the configuration, api and backends share."""

import pytest

from inferwire.addresses import is_unix_socket, join_host_port, split_host_port


@pytest.mark.parametrize(
    ("address", "parts"),
    [
        ("0.0.0.0:50051", ("0.0.0.0", 50051)),
        ("localhost:0", ("localhost", 0)),
        ("triton.ns.svc:65535", ("triton.ns.svc", 65535)),
        ("[::]:50051", ("::", 50051)),
        ("[fe80::1%eth0]:8001", ("fe80::1%eth0", 8001)),
    ],
)
def test_host_and_port_are_split_and_v6_brackets_removed(address, parts):
    assert split_host_port(address) == parts
    assert join_host_port(*parts) == address


@pytest.mark.parametrize(
    "address", ["localhost", ":50051", "localhost:65536", "::1:50051", "host:port", "a b:1", ""]
)
def test_anything_else_is_a_value_error_naming_it(address):
    with pytest.raises(ValueError, match=f"^{address!r} is not host:port$"):
        split_host_port(address)


def test_unix_socket_addresses():
    assert is_unix_socket("unix:/run/inferwire.sock")
    assert is_unix_socket("unix-abstract:inferwire")
    assert not is_unix_socket("localhost:50051")
