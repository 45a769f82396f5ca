"""The backends of the suites that run on every store: ``store_url`` is parametrized over SQLite
and PostgreSQL, and ``pg_database`` is the PostgreSQL test database behind it.

Used by the store contract suite, the engine suite and the reliability suite (their conftests
import the fixtures from here), so that all of them share one PostgreSQL setup.

PostgreSQL runs when ``TETHER_TEST_PG_URL`` names a server and a superuser
(``postgresql://postgres@127.0.0.1:5432/postgres``: the tests create a database, a cast and empty
tables with foreign-key triggers off). Without it every PostgreSQL variant is reported skipped
with ``PG_SKIP`` (CI fails on such skips); a URL that is set but unusable fails the tests instead
of skipping them.

The tests create one database of their own per test process (the database in the URL is only the
entry point and is never written to), migrate it once, empty it before each test (as good as a
fresh database and far faster than creating one per test) and drop it when pytest finishes.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any

import pytest

PG_URL = os.environ.get("TETHER_TEST_PG_URL", "")
#: Always both: without TETHER_TEST_PG_URL the PostgreSQL variants report themselves skipped.
BACKENDS = ["sqlite", "postgres"]
PG_SKIP = (
    "PostgreSQL tests need TETHER_TEST_PG_URL "
    "(a PostgreSQL superuser URL, e.g. postgresql://postgres@127.0.0.1/postgres)"
)

_readers: dict[str, Any] = {}
#: The test database of this process, once created.
_database: dict[str, str] = {}


def pg_connect(url: str) -> Any:
    import psycopg

    return psycopg.connect(url, autocommit=True)


def pg_reader(url: str) -> Any:
    """One autocommit connection per database for the tests' direct reads and writes."""
    connection = _readers.get(url)
    if connection is None or connection.closed:
        connection = _readers[url] = pg_connect(url)
    return connection


def with_database(url: str, name: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{name}", parts.query, parts.fragment))


def _create_database(config: pytest.Config) -> str:
    from tether.store.postgres import PostgresDatabase

    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    name = f"tether_test_{worker}_{uuid.uuid4().hex[:8]}"
    try:
        admin = pg_connect(PG_URL)
    except Exception as error:
        problem = str(error)
    else:
        problem = ""
    if problem:  # a URL that is set but unusable fails the tests, never skips them
        pytest.fail(f"TETHER_TEST_PG_URL is set but PostgreSQL is not usable: {problem}", pytrace=False)

    def drop() -> None:
        for connection in _readers.values():
            connection.close()
        _readers.clear()
        try:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            admin.close()

    config.add_cleanup(drop)
    admin.execute(f'CREATE DATABASE "{name}"')
    # Test speed only: commits need not wait for the disk (nothing here survives a crash).
    admin.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    url = with_database(PG_URL, name)
    database = PostgresDatabase(url, pool_min=1, pool_max=1)
    try:
        database.migrate()
    finally:
        database.close()
    with pg_connect(url) as connection:
        # Tests read blob content as SQLite does, with CAST(content AS TEXT): UTF-8 decoding,
        # where PostgreSQL's own bytea-to-text conversion prints escapes.
        connection.execute(
            "CREATE FUNCTION tether_test_utf8(bytea) RETURNS text LANGUAGE sql IMMUTABLE STRICT "
            "AS $$ SELECT convert_from($1, 'UTF8') $$"
        )
        connection.execute("CREATE CAST (bytea AS text) WITH FUNCTION tether_test_utf8(bytea)")
    return url


@pytest.fixture(scope="session")
def pg_database(request: pytest.FixtureRequest) -> str:
    """The URL of the database created for this test process (migrated, dropped at the end).

    Every conftest that imports this fixture gets the same database: it is created once per
    process, whichever suite asks first."""
    if not PG_URL:
        pytest.skip(PG_SKIP)
    if "url" not in _database:
        _database["url"] = _create_database(request.config)
    url: str = _database["url"]
    return url


def pg_empty(url: str) -> None:
    """Empty every table (schema_migrations and the blob prune counter row stay)."""
    connection = pg_reader(url)
    tables = [
        row[0]
        for row in connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = current_schema() "
            "AND tablename NOT IN ('schema_migrations', 'blob_prunes')"
        )
    ]
    with connection.transaction():
        # Foreign-key triggers off for the emptying (the tables empty together).
        connection.execute("SET LOCAL session_replication_role = replica")
        for table in tables:
            connection.execute(f'DELETE FROM "{table}"')


@pytest.fixture(params=BACKENDS)
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A store URL per backend: a new SQLite file, or the emptied PostgreSQL test database."""
    if request.param == "postgres":
        url: str = request.getfixturevalue("pg_database")
        pg_empty(url)
        return url
    return f"sqlite:///{tmp_path}/tether.db"
