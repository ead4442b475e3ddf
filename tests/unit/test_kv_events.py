"""KV events without a model: the block ledger (core/kv_blocks.py) over holders' token
lists, the batch's msgpack as llm-d's vLLM adapter reads it, and `server.kv_events`'
configuration errors, each naming its field."""

from __future__ import annotations

import msgpack
import pytest

from inferwire.config import load_settings
from inferwire.core.errors import ConfigurationError
from inferwire.core.kv_blocks import (
    AllBlocksCleared,
    BlockEvent,
    BlockLedger,
    BlockRemoved,
    BlockStored,
    block_hashes,
)
from inferwire.kv_events.publisher import KvEventPublisher, encoded_batch

B = 4


def ledger() -> tuple[BlockLedger, list[list[BlockEvent]]]:
    batches: list[list[BlockEvent]] = []
    return BlockLedger(batches.append, block_size=B), batches


def test_a_holder_s_full_blocks_are_stored_chained_and_a_partial_block_is_not():
    blocks, batches = ledger()
    blocks.held("a", [1, 2, 3])  # less than a block
    assert batches == []
    tokens = list(range(10))
    blocks.held("a", tokens)
    [[stored]] = batches
    assert isinstance(stored, BlockStored)
    assert stored.token_ids == tuple(range(8)) and stored.block_size == B
    assert stored.parent_block_hash is None
    assert list(stored.block_hashes) == block_hashes(tokens, "", B)
    blocks.held("a", [*tokens, 10, 11, 12, 13])  # grows by a block: stored after its parent
    assert batches[1] == [
        BlockStored(
            (block_hashes(list(range(14)), "", B)[2],), stored.block_hashes[1], (8, 9, 10, 11), B
        )
    ]


def test_a_block_is_stored_once_and_removed_when_its_last_holder_lets_it_go():
    blocks, batches = ledger()
    shared = [7, 7, 7, 7, 8, 8, 8, 8]
    blocks.held("a", [*shared, 1, 1, 1, 1])
    blocks.held("b", [*shared, 2, 2, 2, 2])  # only the block after the shared ones is new
    second = batches[1][0]
    assert isinstance(second, BlockStored) and second.token_ids == (2, 2, 2, 2)
    assert second.parent_block_hash == block_hashes(shared, "", B)[-1]
    blocks.held("a", shared[:4])  # "a" truncated: its two last blocks; one is b's too
    assert batches[2] == [BlockRemoved((block_hashes([*shared, 1, 1, 1, 1], "", B)[2],))]
    blocks.held("b", [])
    [[removed]] = batches[3:]
    assert isinstance(removed, BlockRemoved) and len(removed.block_hashes) == 2
    blocks.held("a", [])
    assert batches[4] == [BlockRemoved((block_hashes(shared, "", B)[0],))]


def test_other_weights_make_other_blocks_named_by_their_model():
    blocks, batches = ledger()
    tokens = [1, 2, 3, 4]
    blocks.held("a", tokens)
    blocks.held("b", tokens, "sonnets#1", "sonnets")
    base, adapted = batches[0][0], batches[1][0]
    assert isinstance(base, BlockStored) and isinstance(adapted, BlockStored)
    assert base.block_hashes != adapted.block_hashes
    assert (base.lora_name, adapted.lora_name) == (None, "sonnets")


def test_an_adapter_s_blocks_go_with_it_and_the_base_s_stay():
    blocks, batches = ledger()
    tokens = [1, 2, 3, 4, 5, 6, 7, 8]
    blocks.held("base", tokens)
    blocks.held("a", tokens, "sonnets#1", "sonnets")
    blocks.held("b", tokens[:4], "sonnets#1", "sonnets")
    blocks.swap("a", "c")  # moved: still the adapter's
    blocks.drop("sonnets#1")
    assert batches[-1] == [BlockRemoved(tuple(block_hashes(tokens, "sonnets#1", B)))]
    blocks.drop("sonnets#1")  # nothing left of it
    blocks.held("c", [])
    assert len(batches) == 3


def test_clear_reports_all_blocks_cleared_once_and_forgets_them():
    blocks, batches = ledger()
    blocks.clear()
    assert batches == []  # nothing was held
    blocks.held("a", [1, 2, 3, 4])
    blocks.clear()
    assert batches[-1] == [AllBlocksCleared()]
    blocks.held("a", [1, 2, 3, 4])  # stored again: the subscriber dropped it
    assert isinstance(batches[-1][0], BlockStored)


def test_the_batch_is_vllm_s_array_like_msgpack():
    events: list[BlockEvent] = [
        BlockStored((11, 12), None, tuple(range(8)), B),
        BlockStored((13,), 12, (1, 2, 3, 4), B, "sonnets"),
        BlockRemoved((11,)),
        AllBlocksCleared(),
    ]
    ts, decoded, rank = msgpack.unpackb(encoded_batch(events, 1.5))
    assert ts == 1.5 and rank is None  # llm-d reads exactly three fields
    assert decoded == [
        ["BlockStored", [11, 12], None, list(range(8)), B],
        ["BlockStored", [13], 12, [1, 2, 3, 4], B, None, None, "sonnets"],
        ["BlockRemoved", [11]],
        ["AllBlocksCleared"],
    ]
    hashes = block_hashes(list(range(64)), "", 16)
    assert all(0 < h < 2**64 for h in hashes) and len(set(hashes)) == 4


@pytest.mark.parametrize(
    ("block", "field"),
    [
        ({"endpoint": "localhost:5557"}, "server.kv_events.endpoint"),
        ({"endpoint": "tcp://*:5557", "replay_endpoint": "5558"}, "kv_events.replay_endpoint"),
        ({"replay_endpoint": "tcp://*:5558"}, "replay_endpoint: set without endpoint"),
        ({"endpoint": "tcp://*:1", "replay_endpoint": "tcp://*:1"}, "replay_endpoint: the same"),
        ({"topic": "kv@{pod}@{model}"}, "server.kv_events.topic"),
        ({"topic": "kv@{host"}, "server.kv_events.topic"),
        ({"buffer_batches": 0}, "server.kv_events.buffer_batches"),
        ({"endpiont": "tcp://*:5557"}, "server.kv_events.endpiont"),
    ],
)
def test_a_bad_kv_events_block_is_a_configuration_error_naming_the_field(block, field):
    with pytest.raises(ConfigurationError, match="kv_events") as raised:
        load_settings(server={"kv_events": block})
    assert field in str(raised.value)


def test_events_are_off_by_default_and_the_topic_names_host_and_model():
    settings = load_settings().server.kv_events
    assert settings.endpoint is None and settings.replay_endpoint is None
    assert settings.topic_of("pod-1", "demo") == "kv@pod-1@demo"


def test_a_cache_moved_between_holders_is_neither_stored_nor_removed_again():
    blocks, batches = ledger()
    blocks.held("a", [1, 2, 3, 4, 5, 6, 7, 8])
    blocks.held("b", [9, 9, 9, 9])
    blocks.swap("a", "b")  # the slots traded caches
    blocks.held("a", [9, 9, 9, 9])
    blocks.held("b", [1, 2, 3, 4, 5, 6, 7, 8])
    assert len(batches) == 2
    blocks.swap("a", "b")
    blocks.held("a", [1, 2, 3, 4])  # a move that kept only part of the cache
    blocks.held("b", [])  # and one that failed
    assert batches[2:] == [
        [BlockRemoved((block_hashes([1, 2, 3, 4, 5, 6, 7, 8], "", B)[1],))],
        [BlockRemoved((block_hashes([9, 9, 9, 9], "", B)[0],))],
    ]


def test_an_address_that_cannot_be_bound_is_a_configuration_error_naming_the_field():
    first = KvEventPublisher(
        load_settings(server={"kv_events": {"endpoint": "tcp://127.0.0.1:*"}}).server.kv_events
    )
    try:
        for block, field in [
            ({"endpoint": first.endpoint}, "server.kv_events.endpoint"),
            (
                {"endpoint": "tcp://127.0.0.1:*", "replay_endpoint": first.endpoint},
                "server.kv_events.replay_endpoint",
            ),
        ]:
            settings = load_settings(server={"kv_events": block}).server.kv_events
            with pytest.raises(ConfigurationError, match=field) as raised:
                KvEventPublisher(settings)
            assert first.endpoint in str(raised.value)
    finally:
        first.close()
