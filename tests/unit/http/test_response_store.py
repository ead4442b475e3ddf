"""The Responses API's store (http/responses_api/store.py): each model's bounded in entries and
in bytes, the oldest evicted first, a response too large for it not kept, and each
response found by its own tenant only."""

from __future__ import annotations

from inferwire.core.chat import ChatMessage, ToolCall
from inferwire.http.responses_api.store import ENTRY_OVERHEAD_BYTES, ResponseStore, StoredResponse


def stored(
    response_id: str, model: str = "demo", tenant: str = "a", text: str = "x"
) -> StoredResponse:
    conversation = (ChatMessage("user", "hi"), ChatMessage("assistant", text))
    return StoredResponse(response_id, model, tenant, b"{}", conversation)


def test_a_response_counts_its_json_and_its_whole_conversation():
    call = ToolCall("call_1", "get_weather", '{"city": "Oslo"}')
    conversation = (
        ChatMessage("user", "héllo"),  # 6 bytes
        ChatMessage("assistant", "", (call,)),  # 6 + 11 + 16
        ChatMessage("tool", "sunny", tool_call_id="call_1"),  # 5 + 6
    )
    response = StoredResponse("resp_1", "demo", "a", b'{"id":"resp_1"}', conversation)
    assert response.size == ENTRY_OVERHEAD_BYTES + 15 + 6 + 33 + 11
    assert response.call_ids() == {"call_1"}


def test_past_max_entries_the_oldest_is_evicted_first():
    store = ResponseStore(max_entries=2, max_bytes=1 << 20)
    assert store.put(stored("r1")) == []
    assert store.put(stored("r2")) == []
    assert store.put(stored("r3")) == ["r1"]
    assert store.get("r1", "a") is None
    assert [store.get(r, "a") is not None for r in ("r2", "r3")] == [True, True]
    assert store.usage() == {"demo": (2, 2 * stored("r2").size)}


def test_past_max_bytes_the_oldest_go_until_the_new_one_fits():
    one = stored("r0").size
    store = ResponseStore(max_entries=100, max_bytes=3 * one)
    for index in range(3):
        store.put(stored(f"r{index}"))
    big = stored("big", text="y" * (one // 2))  # one and a half small ones
    assert store.put(big) == ["r0", "r1"]
    assert store.get("r2", "a") is not None and store.get("big", "a") is not None
    entries, held = store.usage()["demo"]
    assert (entries, held) == (2, one + big.size) and held <= store.max_bytes


def test_a_response_larger_than_the_store_is_not_kept_and_evicts_nothing():
    small = stored("small")
    store = ResponseStore(max_entries=10, max_bytes=small.size * 2)
    store.put(small)
    huge = stored("huge", text="z" * (small.size * 2))
    assert store.put(huge) == ["huge"]
    assert store.get("huge", "a") is None and store.get("small", "a") is not None


def test_each_model_has_its_own_bounds():
    store = ResponseStore(max_entries=1, max_bytes=1 << 20)
    store.put(stored("d1", model="demo"))
    store.put(stored("s1", model="sim"))
    assert store.get("d1", "a") is not None and store.get("s1", "a") is not None
    store.put(stored("d2", model="demo"))
    assert store.get("d1", "a") is None and store.get("s1", "a") is not None
    assert store.usage() == {"demo": (1, stored("d2").size), "sim": (1, stored("s1").size)}


def test_only_the_tenant_that_made_a_response_finds_or_deletes_it():
    store = ResponseStore(max_entries=10, max_bytes=1 << 20)
    store.put(stored("r1", tenant="alice"))
    assert store.get("r1", "bob") is None
    assert store.delete("r1", "bob") is False
    assert store.get("r1", "alice") is not None
    assert store.delete("r1", "alice") is True
    assert store.get("r1", "alice") is None and store.delete("r1", "alice") is False
    assert store.usage() == {"demo": (0, 0)}


def test_a_store_of_no_entries_keeps_nothing():
    store = ResponseStore(max_entries=0, max_bytes=1 << 20)
    assert store.put(stored("r1")) == ["r1"]
    assert store.get("r1", "a") is None and store.usage() == {}
