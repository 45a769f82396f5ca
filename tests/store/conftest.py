"""The store contract suite's fixtures: every test gets a fresh store for a backend URL.

``store`` is parametrized over the backends (SQLite and PostgreSQL, ``store_url`` from
``tests/pg.py``, which also describes the PostgreSQL test database), so every backend runs this
suite unchanged. Time is driven with ``at(ms)``; tests never sleep.

``rows``, ``row_dicts``, ``execute`` and ``snapshot`` read and write the database directly on
either backend (the engine suite reads through them too).
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests import pg
from tests.pg import PG_SKIP, PG_URL  # noqa: F401 - imported from here by other test modules
from tests.pg import pg_empty as _pg_empty  # noqa: F401 - imported from here by other test modules
from tests.pg import pg_reader as _pg_reader
from tether import open_store
from tether.store import RunRecord, Store
from tether.values import definition_digest

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = 30_000


def at(ms: int = 0) -> datetime:
    """T0 plus ``ms`` milliseconds (every test runs on this fixed clock)."""
    return T0 + timedelta(milliseconds=ms)


SOURCE = {"kind": "builtin", "id": "demo", "revision": "1"}
SNAPSHOT = {"name": "demo", "nodes": ["a"]}
DIGEST = definition_digest(SNAPSHOT)


def reserve_args(run_id: str = "run-1", **overrides: Any) -> dict[str, Any]:
    args: dict[str, Any] = {
        "run_id": run_id,
        "workflow_name": "demo",
        "workflow_source_ref": "builtin:demo",
        "workflow_source": SOURCE,
        "definition_digest": DIGEST,
        "definition_snapshot": SNAPSHOT,
        "input": {"n": 1},
        "origin_session_id": "session-1",
        "now": at(0),
    }
    args.update(overrides)
    return args


# The backends (pytest finds the fixtures by these names; the reliability suite imports them too).
pg_database = pg.pg_database
store_url = pg.store_url


@pytest.fixture
def open_at(store_url: str) -> Iterator[Callable[..., Store]]:
    """Open more stores on the same database (another project, the global view)."""
    opened: list[Store] = []

    def _open(project: str | None = "default") -> Store:
        store = open_store(store_url, project=project)
        opened.append(store)
        return store

    yield _open
    for store in opened:
        store.close()


@pytest.fixture
def store(open_at: Callable[..., Store]) -> Store:
    return open_at()


@pytest.fixture
def reserve(store: Store) -> Callable[..., RunRecord]:
    """Reserve a run with sensible defaults; keyword overrides go to ``store.reserve``."""

    def _reserve(run_id: str = "run-1", **overrides: Any) -> RunRecord:
        return store.reserve(**reserve_args(run_id, **overrides))

    return _reserve


@pytest.fixture
def claimed(store: Store, reserve: Callable[..., RunRecord]) -> Callable[..., RunRecord]:
    """Reserve (unless it exists) and claim a run as ``host-a`` with token ``tok-<run>``."""

    def _claimed(run_id: str = "run-1", *, now: int = 0, running: bool = True, **overrides: Any) -> RunRecord:
        if store.get_run(run_id) is None:
            reserve(run_id, **overrides)
        record = store.claim(
            run_id=run_id, runner_id="host-a", claim_token=f"tok-{run_id}", lease_ms=LEASE, now=at(now)
        )
        assert record is not None
        if running:
            assert store.mark_running(run_id=run_id, claim_token=f"tok-{run_id}", now=at(now))
        return record

    return _claimed


def _is_postgres(store: Store) -> bool:
    return store.db.backend == "postgres"


#: What SQLite's implicit rowid orders these tables by (events: rowid is event_seq).
_PG_ROWID = {
    "events": "event_seq",
    "node_attempts": "position",
    "interactive_submissions": "position",
    "workflow_messages": "position",
}


def _pg_sql(sql: str) -> str:
    """SQLite-flavoured test SQL for PostgreSQL: ``?`` placeholders as ``%s``, blob literals
    ``X'..'`` as bytea, and ``rowid`` as the column that orders the table the same way."""
    sql = re.sub(r"\bX'([0-9A-Fa-f]*)'", r"'\\x\1'::bytea", sql.replace("%", "%%"))
    table = re.search(r"\bFROM\s+(\w+)", sql, re.IGNORECASE)
    if table is not None and table.group(1) in _PG_ROWID:
        sql = re.sub(r"\browid\b", _PG_ROWID[table.group(1)], sql)
    return sql.replace("?", "%s")


def _plain(row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(bytes(value) if isinstance(value, memoryview) else value for value in row)


def snapshot(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table, to assert that a refused call wrote nothing."""
    if _is_postgres(store):
        reader = _pg_reader(store.db.conninfo)  # type: ignore[attr-defined]
        names = [
            row[0]
            for row in reader.execute("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
        ]
        return {
            table: sorted(
                (_plain(tuple(row)) for row in reader.execute(f'SELECT * FROM "{table}"')), key=repr
            )
            for table in sorted(names)
        }
    connection = sqlite3.connect(store.db.path)  # type: ignore[attr-defined]
    try:
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
            )
        ]
        return {
            table: sorted(connection.execute(f'SELECT * FROM "{table}"').fetchall(), key=repr)
            for table in sorted(tables)
        }
    finally:
        connection.close()


def rows(store: Store, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Read rows straight from the database (tests check the stored layout by the spec).

    ``sql`` is written with ``?`` placeholders and runs on either backend."""
    if _is_postgres(store):
        reader = _pg_reader(store.db.conninfo)  # type: ignore[attr-defined]
        return [_plain(tuple(row)) for row in reader.execute(_pg_sql(sql), params).fetchall()]
    connection = sqlite3.connect(store.db.path)  # type: ignore[attr-defined]
    try:
        return connection.execute(sql, params).fetchall()
    finally:
        connection.close()


def row_dicts(store: Store, sql: str, *params: Any) -> list[dict[str, Any]]:
    """Like ``rows``, each row as a dict by column name."""
    if _is_postgres(store):
        reader = _pg_reader(store.db.conninfo)  # type: ignore[attr-defined]
        cursor = reader.execute(_pg_sql(sql), params)
        names = [column.name for column in cursor.description or ()]
        return [dict(zip(names, _plain(tuple(row)), strict=True)) for row in cursor.fetchall()]
    connection = sqlite3.connect(store.db.path)  # type: ignore[attr-defined]
    connection.row_factory = sqlite3.Row
    try:
        return [dict(row) for row in connection.execute(sql, params).fetchall()]
    finally:
        connection.close()


def execute(store: Store, sql: str, *params: Any) -> int:
    """Write straight to the database, committed (puts it into a state no public call reaches);
    ``sql`` as for ``rows``. The number of rows changed."""
    if _is_postgres(store):
        reader = _pg_reader(store.db.conninfo)  # type: ignore[attr-defined]
        return int(reader.execute(_pg_sql(sql), params).rowcount)
    connection = sqlite3.connect(store.db.path)  # type: ignore[attr-defined]
    try:
        with connection:
            return connection.execute(sql, params).rowcount
    finally:
        connection.close()
