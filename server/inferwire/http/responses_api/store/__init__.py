"""The Responses API's stored responses: one interface (`ResponseStore`: put, get, delete,
usage, close) and three stores, chosen by `server.responses.store`:

- `memory.py`: `memory`, in this process (lost on restart, one replica's own);
- `sqlite.py`: `sqlite:///PATH`, and the default, a file in `server.state_dir` (kept
  across restarts), with the standard library's sqlite3 on a worker thread;
- `postgres.py`: `postgresql://…`, a database that replicas share (psycopg 3);
- `base.py`: what they share (`StoredResponse`, its size, the interface); `sql.py`: the
  statements the two databases share.

Each keeps each model's responses within `max_entries` and `max_bytes`, the oldest
evicted first, each response found by its own tenant only; a store that cannot be
reached answers StoreUnavailableError (503 naming it).
"""

from __future__ import annotations

from pathlib import Path

from inferwire.config import RESPONSES_FILE, ResponsesSettings
from inferwire.http.responses_api.store.base import (
    ENTRY_OVERHEAD_BYTES,
    ResponseStore,
    StoredResponse,
)
from inferwire.http.responses_api.store.memory import MemoryStore

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "MemoryStore",
    "ResponseStore",
    "StoredResponse",
    "open_response_store",
    "sqlite_path",
]


def sqlite_path(store: str, state_dir: Path) -> Path:
    """The file of `sqlite://PATH`: an absolute PATH (`sqlite:///var/lib/x.sqlite3`,
    or SQLAlchemy's `sqlite:////var/lib/x.sqlite3`) as it is, `~` expanded, and a
    relative one (`sqlite://x.sqlite3`) under `state_dir`."""
    rest = store.removeprefix("sqlite://")
    if rest.startswith("/"):
        return Path("/" + rest.lstrip("/"))
    path = Path(rest).expanduser()
    return path if path.is_absolute() else state_dir.expanduser() / path


def open_response_store(settings: ResponsesSettings, state_dir: Path) -> ResponseStore:
    """The store `settings.store` names (unset: the SQLite file in `state_dir`); nothing
    is opened before its first use. Raises ConfigurationError for a URL that cannot be."""
    store, bounds = settings.store, (settings.max_entries, settings.max_bytes)
    if store == "memory":
        return MemoryStore(*bounds)
    # Each database's module is imported only where it is chosen (psycopg is not small).
    if store is None:
        from inferwire.http.responses_api.store.sqlite import SqliteStore

        return SqliteStore(state_dir.expanduser() / RESPONSES_FILE, *bounds)
    if store.startswith("sqlite://"):
        from inferwire.http.responses_api.store.sqlite import SqliteStore

        return SqliteStore(sqlite_path(store, state_dir), *bounds)
    from inferwire.http.responses_api.store.postgres import PostgresStore

    return PostgresStore(store, *bounds)
