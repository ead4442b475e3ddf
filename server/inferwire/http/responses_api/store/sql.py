"""The statements the two database stores (SQLite, PostgreSQL) share: one table of
responses, each row a response in the order it was stored (`seq`), its model's bound kept
by deleting its oldest rows in the transaction that inserts a new one.

A row's `size` is the response's as `StoredResponse` counts it, so a model's entries and
bytes are a `COUNT` and a `SUM` of its rows. The rows to evict for a new response are
the shortest run of the model's oldest after which it fits (fewer than `max_entries`
left, and their bytes plus its own at most `max_bytes`): both sums shrink as the run
grows, so they are the rows whose predecessors alone did not make room.
"""

from __future__ import annotations

from dataclasses import dataclass

TABLE = "inferwire_responses"


@dataclass(frozen=True)
class Statements:
    """The shared statements, with a driver's placeholder (`?` for sqlite3, `%s` for
    psycopg)."""

    totals: str  # (model) -> entries, bytes
    evicted: str  # (model, entries, max_entries, bytes, size, max_bytes) -> id, seq, size
    forget_oldest: str  # (model, seq): the model's rows up to seq
    insert: str  # (id, model, tenant, size, body, conversation)
    find: str  # (id, tenant) -> model, body, conversation
    find_model: str  # (id, tenant) -> model
    delete: str  # (id, tenant)
    usage: str  # () -> model, entries, bytes


def statements(p: str) -> Statements:
    return Statements(
        totals=f"SELECT COUNT(*), CAST(COALESCE(SUM(size), 0) AS BIGINT) FROM {TABLE} "
        f"WHERE model = {p}",
        evicted=f"""
            SELECT id, seq, size FROM (
                SELECT id, seq, size, ROW_NUMBER() OVER oldest_first AS k,
                    CAST(SUM(size) OVER oldest_first AS BIGINT) - size AS before
                FROM {TABLE} WHERE model = {p}
                WINDOW oldest_first AS (ORDER BY seq ROWS UNBOUNDED PRECEDING)
            ) AS oldest
            WHERE {p} - (k - 1) >= {p} OR {p} - before + {p} > {p}
            ORDER BY seq""",
        forget_oldest=f"DELETE FROM {TABLE} WHERE model = {p} AND seq <= {p}",
        insert=f"INSERT INTO {TABLE} (id, model, tenant, size, body, conversation) "
        f"VALUES ({p}, {p}, {p}, {p}, {p}, {p})",
        find=f"SELECT model, body, conversation FROM {TABLE} WHERE id = {p} AND tenant = {p}",
        find_model=f"SELECT model FROM {TABLE} WHERE id = {p} AND tenant = {p}",
        delete=f"DELETE FROM {TABLE} WHERE id = {p} AND tenant = {p}",
        usage=f"SELECT model, COUNT(*), CAST(SUM(size) AS BIGINT) FROM {TABLE} GROUP BY model",
    )


def evicted_params(
    model: str, entries: int, max_entries: int, held: int, size: int, max_bytes: int
) -> tuple[str, int, int, int, int, int]:
    """`Statements.evicted`'s parameters, in its placeholders' order."""
    return (model, entries, max_entries, held, size, max_bytes)


def must_evict(entries: int, held: int, size: int, max_entries: int, max_bytes: int) -> bool:
    """Whether a model holding `entries` responses of `held` bytes must lose some for one
    of `size` bytes."""
    return entries >= max_entries or held + size > max_bytes
