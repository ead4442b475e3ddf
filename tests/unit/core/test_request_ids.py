"""Generated request ids: the form of `uuid.uuid4().hex`, and no repeats, in a forked child
either."""

from __future__ import annotations

import os
import uuid

from inferwire.core.record import new_request_id


def test_a_request_id_is_a_version_4_uuid_in_hex() -> None:
    for _ in range(1000):
        request_id = new_request_id()
        parsed = uuid.UUID(hex=request_id)
        assert parsed.hex == request_id  # 32 lower-case hex digits, no dashes
        assert parsed.version == 4
        assert parsed.variant == uuid.RFC_4122


def test_request_ids_do_not_repeat() -> None:
    ids = [new_request_id() for _ in range(100_000)]
    assert len(set(ids)) == len(ids)


def test_a_forked_child_draws_other_ids_than_its_parent() -> None:
    read_end, write_end = os.pipe()
    child = os.fork()
    if child == 0:  # the child: its next ids, then out without running pytest's teardown
        os.write(write_end, " ".join(new_request_id() for _ in range(10)).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        childs = set(pipe.read().split())
    os.waitpid(child, 0)
    parents = {new_request_id() for _ in range(10)}
    assert len(childs) == 10
    assert not childs & parents
