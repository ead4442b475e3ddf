"""`server.responses.store: postgresql://…`: the stored responses in a PostgreSQL database
that replicas share, so a conversation continues (`previous_response_id`), and is read
and deleted, on any replica.

psycopg 3, asynchronous, on one connection per server: the store's calls take turns on
it (an `asyncio.Lock`), each a transaction of its own, committed before it returns. The
table is created on first use (under an advisory lock, so replicas starting together do
not race); a model's bound is kept under an advisory lock of the model's, so two
replicas storing at once evict its oldest once. A connection that fails is dropped and
the call answers 503 naming the store; the next call connects again, and a call that
finds its kept connection broken (the database restarted) retries once on a new one.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow

from inferwire.core.errors import ConfigurationError
from inferwire.http.responses_api.store import sql
from inferwire.http.responses_api.store.base import (
    ResponseStore,
    StoredResponse,
    conversation_json,
    conversation_of,
)

T = TypeVar("T")
Connection = psycopg.AsyncConnection[TupleRow]
SQL = sql.statements("%s")
SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {sql.TABLE} (
        seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        model TEXT NOT NULL,
        tenant TEXT NOT NULL,
        size BIGINT NOT NULL,
        body BYTEA NOT NULL,
        conversation TEXT NOT NULL,
        stored_at TIMESTAMPTZ NOT NULL DEFAULT now()
    )""",
    f"CREATE INDEX IF NOT EXISTS {sql.TABLE}_model_seq ON {sql.TABLE} (model, seq)",
)
CONNECT_TIMEOUT_S = 5  # unless the URL's connect_timeout says otherwise
CALL_TIMEOUT_S = 15.0  # a call's whole time, connecting included


def _lock_key(name: str) -> int:
    """A PostgreSQL advisory lock's key (a signed 64-bit integer) for `name`, the same on
    every replica."""
    digest = hashlib.blake2b(f"{sql.TABLE}:{name}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


SCHEMA_LOCK = _lock_key("schema")


def store_name(url: str) -> str:
    """The URL without its user, password and parameters: `postgresql://host:port/db`."""
    try:
        info = conninfo_to_dict(url)
    except psycopg.Error as error:
        raise ConfigurationError(f"server.responses.store: {error}") from None
    host = str(info.get("host") or "localhost")
    if ":" in host and not host.startswith("/"):
        host = f"[{host}]"
    port = f":{info['port']}" if info.get("port") else ""
    return f"postgresql://{host}{port}/{info.get('dbname') or ''}"


class PostgresStore(ResponseStore):
    """The stored responses in the PostgreSQL database at `url`."""

    def __init__(
        self, url: str, max_entries: int, max_bytes: int, call_timeout_s: float = CALL_TIMEOUT_S
    ) -> None:
        super().__init__(max_entries, max_bytes)
        self.name = store_name(url)  # raises ConfigurationError for a URL libpq refuses
        self._url, self._call_timeout_s = url, call_timeout_s
        self._connect_args: dict[str, object] = {"autocommit": True}
        if "connect_timeout" not in conninfo_to_dict(url):
            self._connect_args["connect_timeout"] = CONNECT_TIMEOUT_S
        self._connection: Connection | None = None
        self._turn = asyncio.Lock()
        self._usage: dict[str, tuple[int, int]] = {}

    async def _put(self, response: StoredResponse) -> list[str]:
        return await self._run(lambda connection: self._insert(connection, response))

    async def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        async def find(connection: Connection) -> TupleRow | None:
            return await (await connection.execute(SQL.find, (response_id, tenant))).fetchone()

        row = await self._run(find)
        if row is None:
            return None
        model, body, conversation = row
        assert isinstance(model, str) and isinstance(body, bytes) and isinstance(conversation, str)
        return StoredResponse(response_id, model, tenant, body, conversation_of(conversation))

    async def delete(self, response_id: str, tenant: str) -> bool:
        return await self._run(lambda connection: self._delete(connection, response_id, tenant))

    def usage(self) -> dict[str, tuple[int, int]]:
        return dict(self._usage)

    async def close(self) -> None:
        async with self._turn:
            await self._drop()

    async def _run(self, work: Callable[[Connection], Awaitable[T]]) -> T:
        """`work` on the store's connection (made if there is none), in its turn."""
        async with self._turn:
            kept = self._connection is not None
            try:
                async with asyncio.timeout(self._call_timeout_s):
                    try:
                        return await work(self._connection or await self._connect())
                    except psycopg.OperationalError:
                        if not kept:
                            raise
                        await self._drop()  # the database restarted: once more, anew
                        return await work(await self._connect())
            except (psycopg.Error, OSError, TimeoutError) as error:
                await self._drop()
                raise self.unavailable(error) from error
            except BaseException:  # cancelled mid-call: the connection's state is unknown
                await self._drop()
                raise

    async def _connect(self) -> Connection:
        connection: Connection = await psycopg.AsyncConnection.connect(
            self._url,
            **self._connect_args,  # type: ignore[arg-type]
        )
        try:
            async with connection.transaction():
                await connection.execute("SELECT pg_advisory_xact_lock(%s)", (SCHEMA_LOCK,))
                for statement in SCHEMA:
                    await connection.execute(statement)
            rows = await (await connection.execute(SQL.usage)).fetchall()
        except BaseException:
            await connection.close()
            raise
        self._usage = {m: (int(n), int(b)) for m, n, b in rows}
        self._connection = connection
        return connection

    async def _drop(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            await connection.close()

    async def _insert(self, connection: Connection, response: StoredResponse) -> list[str]:
        model, size = response.model, response.size
        async with connection.transaction():
            await connection.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(model),))
            entries, held = await _totals(connection, model)
            evicted: list[TupleRow] = []
            if sql.must_evict(entries, held, size, self.max_entries, self.max_bytes):
                params = sql.evicted_params(
                    model, entries, self.max_entries, held, size, self.max_bytes
                )
                evicted = await (await connection.execute(SQL.evicted, params)).fetchall()
                if evicted:
                    await connection.execute(SQL.forget_oldest, (model, evicted[-1][1]))
            conversation = conversation_json(response.conversation)
            await connection.execute(
                SQL.insert, (response.id, model, response.tenant, size, response.body, conversation)
            )
        freed = sum(int(row[2]) for row in evicted)
        self._usage[model] = (entries - len(evicted) + 1, held - freed + size)
        return [str(row[0]) for row in evicted]

    async def _delete(self, connection: Connection, response_id: str, tenant: str) -> bool:
        async with connection.transaction():
            found = await connection.execute(SQL.find_model, (response_id, tenant))
            row = await found.fetchone()
            if row is None:
                return False
            model = row[0]
            await connection.execute(SQL.delete, (response_id, tenant))
            totals = await _totals(connection, model)
        self._usage[model] = totals
        return True


async def _totals(connection: Connection, model: str) -> tuple[int, int]:
    """`model`'s stored responses and their bytes."""
    row = await (await connection.execute(SQL.totals, (model,))).fetchone()
    assert row is not None
    entries, held = row
    return int(entries), int(held)
