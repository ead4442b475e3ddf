"""The Responses store's contract (http/responses_api/store/), which every store keeps:
each model's bounds in entries and bytes, the oldest evicted first, a response too large
for it not kept, each response found by its own tenant only, a conversation read back as
it was stored, and `usage` as the gauges read it; a database store's responses outlive
the store (a restarted server) and are seen by another store on the same database (a
second replica).

A tier's `Test…` class inherits `StoreContract` and gives the fixture `open_store`: a
callable `(max_entries=10, max_bytes=1 MiB) -> ResponseStore`, each call a store on the
same backing (a new process's view of it), all closed after the test; `durable` says
whether that backing outlives a store (memory's does not).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from inferwire.core.chat import ChatMessage, ToolCall
from inferwire.http.responses_api.store import ResponseStore, StoredResponse

OpenStore = Callable[..., ResponseStore]


def stored(
    response_id: str, model: str = "demo", tenant: str = "a", text: str = "x"
) -> StoredResponse:
    conversation = (ChatMessage("user", "hi"), ChatMessage("assistant", text))
    return StoredResponse(response_id, model, tenant, b"{}", conversation)


async def found(store: ResponseStore, *ids: str, tenant: str = "a") -> list[bool]:
    return [await store.get(response_id, tenant) is not None for response_id in ids]


class StoreContract:
    durable = True

    async def test_past_max_entries_the_oldest_is_evicted_first(self, open_store: OpenStore):
        store = open_store(max_entries=2)
        assert await store.put(stored("r1")) == []
        assert await store.put(stored("r2")) == []
        assert await store.put(stored("r3")) == ["r1"]
        assert await found(store, "r1", "r2", "r3") == [False, True, True]
        assert store.usage() == {"demo": (2, 2 * stored("r2").size)}

    async def test_past_max_bytes_the_oldest_go_until_the_new_one_fits(self, open_store: OpenStore):
        one = stored("r0").size
        store = open_store(max_entries=100, max_bytes=3 * one)
        for index in range(3):
            await store.put(stored(f"r{index}"))
        big = stored("big", text="y" * (one // 2))  # one and a half small ones
        assert await store.put(big) == ["r0", "r1"]
        assert await found(store, "r2", "big") == [True, True]
        entries, held = store.usage()["demo"]
        assert (entries, held) == (2, one + big.size) and held <= store.max_bytes

    async def test_a_response_larger_than_the_store_is_not_kept_and_evicts_nothing(
        self, open_store: OpenStore
    ):
        small = stored("small")
        store = open_store(max_bytes=small.size * 2)
        await store.put(small)
        huge = stored("huge", text="z" * (small.size * 2))
        assert await store.put(huge) == ["huge"]
        assert await found(store, "huge", "small") == [False, True]

    async def test_max_entries_0_keeps_nothing(self, open_store: OpenStore):
        store = open_store(max_entries=0)
        assert await store.put(stored("r1")) == ["r1"]
        assert await found(store, "r1") == [False]

    async def test_each_model_has_its_own_bounds(self, open_store: OpenStore):
        store = open_store(max_entries=1)
        await store.put(stored("d1", model="demo"))
        await store.put(stored("o1", model="other"))
        assert await store.put(stored("d2", model="demo")) == ["d1"]
        assert await found(store, "o1", "d2") == [True, True]
        assert store.usage() == {"demo": (1, stored("d2").size), "other": (1, stored("o1").size)}

    async def test_another_tenant_finds_nothing_and_deletes_nothing(self, open_store: OpenStore):
        store = open_store()
        await store.put(stored("r1", tenant="alice"))
        assert await store.get("r1", "bob") is None
        assert await store.delete("r1", "bob") is False
        assert (await store.get("r1", "alice")) == stored("r1", tenant="alice")
        assert await store.delete("r1", "alice") is True
        assert await store.get("r1", "alice") is None
        assert await store.delete("r1", "alice") is False
        assert store.usage() == {"demo": (0, 0)}

    async def test_a_response_reads_back_as_it_was_stored(self, open_store: OpenStore):
        call = ToolCall("call_1", "get_weather", '{"city": "Zürich"}')
        conversation = (
            ChatMessage("system", "Be brief."),
            ChatMessage("user", "Wetter in Zürich? 🌧"),
            ChatMessage("assistant", "", (call, ToolCall("call_2", "noop", "{}"))),
            ChatMessage("tool", "nass", tool_call_id="call_1"),
            ChatMessage("assistant", "Nass.\n"),
        )
        body = '{"id":"resp_1","output_text":"Nass.\\n","é":"\\u00e9"}'.encode()
        response = StoredResponse("resp_1", "demo", "a", body, conversation)
        store = open_store()
        await store.put(response)
        again = await store.get("resp_1", "a")
        assert again == response and again.size == response.size
        assert again.call_ids() == {"call_1", "call_2"}

    async def test_an_unknown_id_is_absent(self, open_store: OpenStore):
        store = open_store()
        assert await store.get("resp_0", "a") is None
        assert await store.delete("resp_0", "a") is False

    async def test_a_new_store_on_the_same_backing_finds_what_the_first_stored(
        self, open_store: OpenStore
    ):
        if not self.durable:
            pytest.skip("a memory store is its process's own")
        first = open_store(max_entries=2)
        await first.put(stored("r1"))
        await first.put(stored("r2", tenant="b"))
        await first.close()
        second = open_store(max_entries=2)  # a restarted server, or a second replica
        assert await second.get("r1", "a") == stored("r1")
        assert second.usage() == {"demo": (2, 2 * stored("r1").size)}  # read on first use
        assert await second.put(stored("r3")) == ["r1"]  # the bound spans both
        third = open_store(max_entries=2)
        assert await third.delete("r2", "b") is True
        assert await found(second, "r2", tenant="b") == [False]
        assert await found(third, "r3") == [True]
