"""The store contract suite's fixtures: every test gets a fresh store for a backend URL.

``store`` is parametrized over the backends (SQLite and PostgreSQL), so every backend runs this
suite unchanged. Time is driven with ``at(ms)``; tests never sleep.

PostgreSQL joins the backends when ``TETHER_TEST_PG_URL`` names a server and a superuser
(``postgresql://postgres@127.0.0.1:5432/postgres``: the suite creates a database, a cast and empties
tables with foreign-key triggers off); a URL that is set but unusable fails the run instead of
skipping it.
The suite creates one database of its own for the session (the database in the URL is only the
entry point and is never written to), migrates it once, and empties it before each test, which
is as good as a fresh database and far faster than creating one per test.
"""

from __future__ import annotations

import os
import re
import sqlite3
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tether import open_store
from tether.store import RunRecord, Store
from tether.values import definition_digest

PG_URL = os.environ.get("TETHER_TEST_PG_URL", "")
BACKENDS = ["sqlite", "postgres"] if PG_URL else ["sqlite"]
PG_SKIP = "PostgreSQL tests need TETHER_TEST_PG_URL (a PostgreSQL superuser URL, e.g. postgresql://postgres@127.0.0.1/postgres)"
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


# -- PostgreSQL test database ---------------------------------------------------------------
_pg_readers: dict[str, Any] = {}


def _pg_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def _pg_reader(url: str) -> Any:
    """One autocommit connection per database for the direct reads of ``rows`` and ``snapshot``."""
    connection = _pg_readers.get(url)
    if connection is None or connection.closed:
        connection = _pg_readers[url] = _pg_connect(url)
    return connection


def _with_database(url: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """The URL of a database created for this test session (migrated, dropped at the end)."""
    if not PG_URL:
        pytest.skip(PG_SKIP)
    from tether.store.postgres import PostgresDatabase

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"tether_test_{worker}_{uuid.uuid4().hex[:8]}"
    try:
        admin = _pg_connect(PG_URL)
    except Exception as error:  # a URL that is set but unusable fails the run, never skips it
        pytest.fail(f"TETHER_TEST_PG_URL is set but PostgreSQL is not usable: {error}", pytrace=False)
    try:
        admin.execute(f'CREATE DATABASE "{name}"')
        # Test speed only: commits need not wait for the disk (nothing here survives a crash).
        admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
        url = _with_database(PG_URL, name)
        database = PostgresDatabase(url, pool_min=1, pool_max=1)
        try:
            database.migrate()
        finally:
            database.close()
        with _pg_connect(url) as connection:
            # Tests read blob content as SQLite does, with CAST(content AS TEXT): UTF-8 decoding,
            # where PostgreSQL's own bytea-to-text conversion prints escapes.
            connection.execute(
                "CREATE FUNCTION tether_test_utf8(bytea) RETURNS text LANGUAGE sql IMMUTABLE STRICT "
                "AS $$ SELECT convert_from($1, 'UTF8') $$"
            )
            connection.execute("CREATE CAST (bytea AS text) WITH FUNCTION tether_test_utf8(bytea)")
        yield url
    finally:
        for connection in _pg_readers.values():
            connection.close()
        _pg_readers.clear()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()


def _pg_empty(url: str) -> None:
    """Empty every table (schema_migrations and the event counter row stay, the counter at 0)."""
    connection = _pg_reader(url)
    tables = [
        row[0]
        for row in connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename NOT IN ('schema_migrations', 'event_sequence')"
        )
    ]
    with connection.transaction():
        # Foreign-key triggers off for the emptying (the tables empty together).
        connection.execute("SET LOCAL session_replication_role = replica")
        for table in tables:
            connection.execute(f'DELETE FROM "{table}"')
        connection.execute("UPDATE event_sequence SET value = 0")


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        url: str = request.getfixturevalue("pg_database")
        _pg_empty(url)
        return url
    return f"sqlite:///{tmp_path}/tether.db"


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
