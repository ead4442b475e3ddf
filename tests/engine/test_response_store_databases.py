"""The Responses store on real databases: the store contract (tests/support/
store_contract.py) on a real PostgreSQL (a throwaway cluster, tests/support/postgres.py),
and real `inferwire serve` processes: one killed and started again on the same SQLite
file answers `GET /v1/responses/{id}` and continues `previous_response_id`; two replicas
on one PostgreSQL database read, continue and delete each other's responses; with the
database gone, what needs the store is a 503 naming it while `store: false` answers, and
the store serves again when the database is back.

The servers serve `sim-answer`, a simulator model that answers six words at once: what
is tested is the store, not an engine.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from inferwire.http.responses_api.store import ResponseStore
from inferwire.http.responses_api.store.postgres import PostgresStore
from inferwire.http.responses_api.store.sql import TABLE
from tests.support.postgres import PostgresCluster, postgres_cluster
from tests.support.process import ServerProcess, serving_with_config, stop_server_process
from tests.support.store_contract import OpenStore, StoreContract, stored


def _config(store: str) -> str:
    model = {
        "name": "sim-answer",
        "backend": "simulator",
        "load_on_startup": True,
        "options": {"time_to_first_token_ms": 0, "inter_token_ms": 0, "output_tokens": 6},
    }
    server = {"grace_period_s": 1, "responses": {"store": store}}
    return json.dumps({"server": server, "models": [model]})


def _client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.http_url + "/v1", api_key="unused", max_retries=0)


def _events(server: ServerProcess, **body: Any) -> list[tuple[str, dict[str, Any]]]:
    """A streamed response's events, each its type and data."""
    asked = {"model": "sim-answer", "stream": True, **body}
    answer = httpx.post(server.http_url + "/v1/responses", json=asked, timeout=30)
    assert answer.status_code == 200, answer.text
    events = []
    for block in answer.text.strip().split("\n\n"):
        kind, data = block.split("\n", 1)
        events.append((kind.removeprefix("event: "), json.loads(data.removeprefix("data: "))))
    return events


@pytest.fixture(scope="module")
def postgres() -> Iterator[PostgresCluster]:
    with postgres_cluster() as cluster:
        yield cluster


class TestPostgresStore(StoreContract):
    @pytest.fixture
    async def open_store(self, postgres: PostgresCluster) -> AsyncIterator[OpenStore]:
        postgres.execute(f"DROP TABLE IF EXISTS {TABLE}")
        opened: list[ResponseStore] = []

        def open_store(max_entries: int = 10, max_bytes: int = 1 << 20) -> ResponseStore:
            opened.append(PostgresStore(postgres.url(), max_entries, max_bytes))
            return opened[-1]

        yield open_store
        for store in opened:
            await store.close()

    async def test_replicas_storing_at_once_keep_the_bound(self, open_store: OpenStore):
        replicas = [open_store(max_entries=5) for _ in range(3)]
        await asyncio.gather(
            *(r.put(stored(f"r{n}-{i}")) for n, r in enumerate(replicas) for i in range(10))
        )
        fresh = open_store(max_entries=5)
        assert await fresh.get("none", "a") is None  # opened: its usage read from the table
        assert fresh.usage() == {"demo": (5, 5 * stored("r0-0").size)}


def test_a_server_started_again_on_its_sqlite_file_answers_and_continues(tmp_path: Path):
    store = f"sqlite://{tmp_path}/responses.sqlite3"
    with serving_with_config(tmp_path, _config(store)) as first:
        made = _client(first).responses.create(model="sim-answer", input="Hello there")
        streamed = _events(first, input="Hi")[-1][1]["response"]
        assert streamed["status"] == "completed"
        stop_server_process(first)  # SIGKILL: no drain, no close; what was answered is kept
    with serving_with_config(tmp_path, _config(store)) as second:
        client = _client(second)
        assert client.responses.retrieve(made.id).model_dump() == made.model_dump()
        kept = httpx.get(f"{second.http_url}/v1/responses/{streamed['id']}", timeout=30)
        assert kept.json() == streamed  # the stream's last event's response, as it was sent
        chained = client.responses.create(
            model="sim-answer", previous_response_id=made.id, input="And then?"
        )
        history: Any = [
            {"role": "user", "content": "Hello there"},
            {"role": "assistant", "content": made.output_text},
            {"role": "user", "content": "And then?"},
        ]
        whole = client.responses.create(model="sim-answer", input=history)
        assert chained.previous_response_id == made.id and chained.usage and whole.usage
        assert chained.usage.input_tokens == whole.usage.input_tokens


def test_a_second_replica_reads_continues_and_deletes_what_the_first_stored(
    postgres: PostgresCluster, tmp_path: Path
):
    postgres.execute("CREATE DATABASE replicas")
    config = _config(postgres.url("replicas"))
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with (
        serving_with_config(tmp_path / "a", config) as first,
        serving_with_config(tmp_path / "b", config) as second,
    ):
        one, two = _client(first), _client(second)
        made = one.responses.create(model="sim-answer", input="Remember the number 7.")
        assert two.responses.retrieve(made.id).model_dump() == made.model_dump()
        chained = two.responses.create(
            model="sim-answer", previous_response_id=made.id, input="Which number?"
        )
        assert chained.usage and made.usage
        assert chained.usage.input_tokens > made.usage.input_tokens  # the history came along
        assert one.responses.retrieve(chained.id).previous_response_id == made.id
        deleted = httpx.delete(f"{second.http_url}/v1/responses/{made.id}", timeout=30)
        assert deleted.json() == {"id": made.id, "object": "response", "deleted": True}
        with pytest.raises(openai.NotFoundError):
            one.responses.retrieve(made.id)
        metrics = httpx.get(first.http_url + "/metrics", timeout=30).text
        assert 'inferwire_responses_stored{model="sim-answer"}' in metrics


def test_with_the_database_gone_what_needs_the_store_is_503_naming_it(
    postgres: PostgresCluster, tmp_path: Path
):
    postgres.execute("CREATE DATABASE gone")
    with serving_with_config(tmp_path, _config(postgres.url("gone"))) as server:
        client = _client(server)
        made = client.responses.create(model="sim-answer", input="Before")
        name = f"postgresql://127.0.0.1:{postgres.port}/gone"
        postgres.stop()
        try:
            refusals = [
                lambda: client.responses.create(model="sim-answer", input="Stored?"),
                lambda: client.responses.retrieve(made.id),
                lambda: client.responses.delete(made.id),
                lambda: client.responses.create(
                    model="sim-answer", input="x", previous_response_id=made.id, store=False
                ),
            ]
            for refused in refusals:
                with pytest.raises(openai.InternalServerError) as raised:
                    refused()
                assert raised.value.status_code == 503
                assert f"the Responses store {name} is unavailable" in raised.value.message
            # A stream that asked to store ends failed, its last events saying why.
            (error, data), (failed, last) = _events(server, input="Stored?")[-2:]
            assert (error, failed) == ("error", "response.failed")
            assert name in data["message"] and last["response"]["status"] == "failed"
            # What does not need the store answers as ever.
            unstored = client.responses.create(model="sim-answer", input="Hi", store=False)
            assert unstored.status == "completed"
            events = _events(server, input="Hi", store=False)
            assert events[-1][0] == "response.completed"
        finally:
            postgres.start()
        assert client.responses.retrieve(made.id).id == made.id  # back, on a new connection
        again = client.responses.create(model="sim-answer", input="After")
        assert client.responses.retrieve(again.id).id == again.id
