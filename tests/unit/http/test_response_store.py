"""The Responses API's stores (http/responses_api/store/): the contract (tests/support/
store_contract.py) kept by the memory store and by the SQLite store on a real file
(PostgreSQL's is in tests/engine/test_response_store_databases.py); how a response is
counted; which store `server.responses.store` chooses and where the default's file is;
a store that cannot be reached answers StoreUnavailableError naming it, and serves again
once it can be."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from inferwire.config import ResponsesSettings, default_state_dir, load_settings
from inferwire.core.chat import ChatMessage, ToolCall
from inferwire.core.errors import ConfigurationError, StoreUnavailableError
from inferwire.edge.errors import Code, code_for
from inferwire.http.responses_api.store import (
    ENTRY_OVERHEAD_BYTES,
    MemoryStore,
    ResponseStore,
    StoredResponse,
    open_response_store,
    sqlite_path,
)
from inferwire.http.responses_api.store.postgres import PostgresStore
from inferwire.http.responses_api.store.sqlite import SqliteStore
from tests.support.store_contract import OpenStore, StoreContract, stored


class TestMemoryAndSqliteStores(StoreContract):
    @pytest.fixture(params=["memory", "sqlite"])
    async def open_store(
        self, request: pytest.FixtureRequest, tmp_path: Path
    ) -> AsyncIterator[OpenStore]:
        self.durable = request.param != "memory"
        opened: list[ResponseStore] = []
        memory: list[MemoryStore] = []

        def open_store(max_entries: int = 10, max_bytes: int = 1 << 20) -> ResponseStore:
            if request.param == "memory":  # one process: every "new" store is the same one
                if not memory:
                    memory.append(MemoryStore(max_entries, max_bytes))
                return memory[0]
            store = SqliteStore(tmp_path / "responses.sqlite3", max_entries, max_bytes)
            opened.append(store)
            return store

        yield open_store
        for store in opened + memory:
            await store.close()


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


def test_the_setting_chooses_the_store_and_the_default_is_a_file_in_the_state_dir(
    tmp_path: Path,
):
    def chosen(store: str | None) -> ResponseStore:
        return open_response_store(ResponsesSettings(store=store, max_entries=3), tmp_path)

    default = chosen(None)
    assert isinstance(default, SqliteStore) and default.max_entries == 3
    assert default.path == tmp_path / "responses.sqlite3"
    assert default.name == f"sqlite://{tmp_path}/responses.sqlite3"
    assert not default.path.exists()  # made on first use
    assert isinstance(chosen("memory"), MemoryStore)
    assert chosen("sqlite:///var/lib/x.sqlite3").path == Path("/var/lib/x.sqlite3")  # type: ignore[attr-defined]
    postgres = chosen("postgresql://app:secret@db.example:6543/inferwire?sslmode=require")
    assert isinstance(postgres, PostgresStore)
    assert postgres.name == "postgresql://db.example:6543/inferwire"  # no user, no password


@pytest.mark.parametrize(
    ("store", "path"),
    [
        ("sqlite:///var/lib/r.sqlite3", "/var/lib/r.sqlite3"),
        ("sqlite:////var/lib/r.sqlite3", "/var/lib/r.sqlite3"),  # as SQLAlchemy writes it
        ("sqlite://r.sqlite3", "STATE/r.sqlite3"),
        ("sqlite://sub/r.sqlite3", "STATE/sub/r.sqlite3"),
    ],
)
def test_a_sqlite_url_names_an_absolute_file_or_one_in_the_state_dir(store: str, path: str):
    assert sqlite_path(store, Path("/state")) == Path(path.replace("STATE", "/state"))


@pytest.mark.parametrize("store", ["redis://x", "sqlite://", "sqlite:///", "mysql://db/x", ""])
def test_an_unknown_store_is_a_configuration_error_naming_the_setting(store: str):
    with pytest.raises(ConfigurationError, match=r"server\.responses\.store: must be memory"):
        load_settings(server={"responses": {"store": store}})


def test_the_state_dir_follows_xdg_state_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_state_dir() == tmp_path / "inferwire"
    monkeypatch.setenv("XDG_STATE_HOME", "relative")  # ignored, as the specification says
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_state_dir() == tmp_path / "home/.local/state/inferwire"
    monkeypatch.setenv("INFERWIRE_SERVER__STATE_DIR", "~/state")
    assert load_settings().server.state_dir == tmp_path / "home/state"


def test_an_unreachable_store_is_unavailable_naming_it():
    error = StoreUnavailableError("the Responses store x is unavailable: gone")
    assert code_for(error) is Code.UNAVAILABLE  # 503 on HTTP


async def test_a_sqlite_file_that_cannot_be_made_is_unavailable_until_it_can(tmp_path: Path):
    blocker = tmp_path / "state"
    blocker.write_text("a file where the directory should be")
    store = SqliteStore(blocker / "responses.sqlite3", 10, 1 << 20)
    for attempt in (store.put(stored("r1")), store.get("r1", "a")):
        with pytest.raises(StoreUnavailableError) as raised:
            await attempt
        assert str(raised.value).startswith(f"the Responses store sqlite://{blocker}/")
    blocker.unlink()
    assert await store.put(stored("r1")) == []  # the directory made, the table too
    assert await store.get("r1", "a") == stored("r1")
    await store.close()


async def test_a_postgresql_store_with_no_server_is_unavailable_naming_it():
    with socket.socket() as unused:  # bound, never listening: connections are refused
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
        store = PostgresStore(f"postgresql://u:pw@127.0.0.1:{port}/db", 10, 1 << 20)
        with pytest.raises(StoreUnavailableError) as raised:
            await store.get("resp_1", "a")
    message = str(raised.value)
    assert message.startswith(f"the Responses store postgresql://127.0.0.1:{port}/db is ")
    assert "pw" not in message
    await store.close()
