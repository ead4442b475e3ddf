"""`server.responses.store: sqlite:///PATH` (and the default, a file in
`server.state_dir`): the stored responses in one SQLite file, which outlives the process.

The standard library's sqlite3 runs on one worker thread of the store's own, never on
the event loop; the file, its folders and the table are made on first use. A response is
committed (WAL, `synchronous=FULL`) before `put` returns, so a response answered is one
a restarted server finds. Several processes may share the file (SQLite's locks, each
write its own transaction), though replicas on several hosts want PostgreSQL.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from inferwire.http.responses_api.store import sql
from inferwire.http.responses_api.store.base import (
    ResponseStore,
    StoredResponse,
    conversation_json,
    conversation_of,
)

T = TypeVar("T")
SQL = sql.statements("?")
SCHEMA = (
    f"""CREATE TABLE IF NOT EXISTS {sql.TABLE} (
        seq INTEGER PRIMARY KEY,
        id TEXT NOT NULL UNIQUE,
        model TEXT NOT NULL,
        tenant TEXT NOT NULL,
        size INTEGER NOT NULL,
        body BLOB NOT NULL,
        conversation TEXT NOT NULL
    )""",
    f"CREATE INDEX IF NOT EXISTS {sql.TABLE}_model_seq ON {sql.TABLE} (model, seq)",
)
BUSY_TIMEOUT_S = 10.0  # how long a write waits for another process's


class SqliteStore(ResponseStore):
    """The stored responses in the SQLite file `path`."""

    def __init__(self, path: Path, max_entries: int, max_bytes: int) -> None:
        super().__init__(max_entries, max_bytes)
        self.path = path.expanduser().absolute()
        self.name = f"sqlite://{self.path}"
        self._executor: ThreadPoolExecutor | None = None
        self._db: sqlite3.Connection | None = None  # used on the executor's thread only
        self._usage: dict[str, tuple[int, int]] = {}

    async def _put(self, response: StoredResponse) -> list[str]:
        return await self._run(lambda db: self._insert(db, response))

    async def get(self, response_id: str, tenant: str) -> StoredResponse | None:
        row = await self._run(lambda db: db.execute(SQL.find, (response_id, tenant)).fetchone())
        if row is None:
            return None
        model, body, conversation = row
        conversation = conversation_of(conversation)
        return StoredResponse(response_id, model, tenant, bytes(body), conversation)

    async def delete(self, response_id: str, tenant: str) -> bool:
        return await self._run(lambda db: self._delete(db, response_id, tenant))

    def usage(self) -> dict[str, tuple[int, int]]:
        return dict(self._usage)

    async def close(self) -> None:
        if self._executor is None:
            return
        executor, self._executor = self._executor, None
        await asyncio.get_running_loop().run_in_executor(executor, self._close_db)
        executor.shutdown(wait=True)  # its one task is done: this joins an idle thread

    # ---- on the store's thread ------------------------------------------------------

    async def _run(self, work: Callable[[sqlite3.Connection], T]) -> T:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="responses-sqlite")
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, self._in_thread, work)

    def _in_thread(self, work: Callable[[sqlite3.Connection], T]) -> T:
        try:
            return work(self._db or self._open())
        except (sqlite3.ProgrammingError, sqlite3.InterfaceError):
            raise  # a misuse of sqlite3 is a bug: INTERNAL
        except (sqlite3.Error, OSError) as error:
            self._close_db()  # opened again by the next call: the file may be back
            raise self.unavailable(error) from error

    def _open(self) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        db = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        try:
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            for statement in SCHEMA:
                db.execute(statement)
            usage = db.execute(SQL.usage).fetchall()
        except BaseException:
            db.close()
            raise
        self._usage = {model: (entries, held) for model, entries, held in usage}
        self._db = db
        return db

    def _close_db(self) -> None:
        db, self._db = self._db, None
        if db is not None:
            db.close()

    def _insert(self, db: sqlite3.Connection, response: StoredResponse) -> list[str]:
        model, size = response.model, response.size
        with _transaction(db):
            entries, held = db.execute(SQL.totals, (model,)).fetchone()
            evicted: list[tuple[str, int, int]] = []
            if sql.must_evict(entries, held, size, self.max_entries, self.max_bytes):
                params = sql.evicted_params(
                    model, entries, self.max_entries, held, size, self.max_bytes
                )
                evicted = db.execute(SQL.evicted, params).fetchall()
                if evicted:
                    db.execute(SQL.forget_oldest, (model, evicted[-1][1]))
            conversation = conversation_json(response.conversation)
            db.execute(
                SQL.insert, (response.id, model, response.tenant, size, response.body, conversation)
            )
        freed = sum(row[2] for row in evicted)
        self._usage[model] = (entries - len(evicted) + 1, held - freed + size)
        return [row[0] for row in evicted]

    def _delete(self, db: sqlite3.Connection, response_id: str, tenant: str) -> bool:
        with _transaction(db):
            row = db.execute(SQL.find_model, (response_id, tenant)).fetchone()
            if row is None:
                return False
            db.execute(SQL.delete, (response_id, tenant))
            entries, held = db.execute(SQL.totals, (row[0],)).fetchone()
        self._usage[row[0]] = (entries, held)
        return True


@contextmanager
def _transaction(db: sqlite3.Connection) -> Iterator[None]:
    """One write transaction, begun IMMEDIATE (the write lock first, so that two
    processes' evictions never interleave), committed at the end or rolled back."""
    db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if db.in_transaction:
            db.rollback()
        raise
    db.execute("COMMIT")
