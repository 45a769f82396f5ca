"""The physical limit: the least a durable queue must do per run, in plain SQL.

One row per run; a worker claims the oldest queued row in one transaction and marks it done in a
second one: two commits per run, with the same journal mode and durability setting as the store
it is compared with (SQLite: WAL and the same ``synchronous`` in the same folder; PostgreSQL: the
same server with ``synchronous_commit=on``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from typing import Any

from bench.common import Counter, pg_count, pg_create, pg_drop, pg_dsn, sqlite_durability
from bench.peers import sigterm_event
from bench.peers.base import Peer

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, status INTEGER NOT NULL, owner TEXT)",
    "CREATE INDEX IF NOT EXISTS jobs_queued ON jobs (id) WHERE status = 0",
)
PG_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS jobs (id BIGSERIAL PRIMARY KEY, status INTEGER NOT NULL, owner TEXT)",
    "CREATE INDEX IF NOT EXISTS jobs_queued ON jobs (id) WHERE status = 0",
)
CLAIM = (
    "UPDATE jobs SET status = 1, owner = ? WHERE id = (SELECT id FROM jobs WHERE status = 0 ORDER BY id "
    "LIMIT 1) RETURNING id"
)
PG_CLAIM = (
    "UPDATE jobs SET status = 1, owner = %s WHERE id = (SELECT id FROM jobs WHERE status = 0 ORDER BY id "
    "LIMIT 1 FOR UPDATE SKIP LOCKED) RETURNING id"
)


class LimitPeer(Peer):
    key = "limit"
    worker_note = "plain SQL: claim transaction, then done transaction (two commits per run)"

    @property
    def backend(self) -> str:  # type: ignore[override]
        return str(self.options.get("backend", "sqlite"))

    @property
    def label(self) -> str:
        if self.backend == "postgres":
            return "physical limit (postgres)"
        return f"physical limit (sqlite {self.options.get('synchronous', 'FULL')})"

    @property
    def path(self) -> str:
        return str(self.workdir / "limit.db")

    def prepare(self) -> None:
        super().prepare()
        if self.backend == "postgres":
            self.options["database"] = pg_create("limit")

    def cleanup(self) -> None:
        if self.backend == "postgres" and "database" in self.options:
            pg_drop(self.options.pop("database"))
        super().cleanup()

    def settings(self) -> dict[str, Any]:
        found = super().settings()
        found.pop("database", None)
        return found

    def connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(self.path, isolation_level=None, timeout=30)
        connection.execute("PRAGMA busy_timeout = 30000")
        connection.execute("PRAGMA journal_mode = WAL")
        connection.execute(f"PRAGMA synchronous = {self.options.get('synchronous', 'FULL')}")
        return connection

    def pg_connect(self) -> Any:
        import psycopg

        return psycopg.connect(
            pg_dsn(self.options["database"]), autocommit=True, options="-c synchronous_commit=on"
        )

    def done_count(self, counter: Counter, n: int) -> int:
        sql = "SELECT count(*) FROM jobs WHERE status = 2"
        if self.backend == "postgres":
            return pg_count(self.options["database"], sql)
        with sqlite3.connect(self.path, timeout=30) as connection:
            return int(connection.execute(sql).fetchone()[0])

    def setup_here(self) -> dict[str, Any]:
        if self.backend == "postgres":
            with self.pg_connect() as connection:
                for statement in PG_SCHEMA:
                    connection.execute(statement)
        else:
            connection = self.connect()
            for statement in SCHEMA:
                connection.execute(statement)
            connection.close()
        return {}

    def enqueue_here(self, n: int) -> dict[str, Any]:
        if self.backend == "postgres":
            with self.pg_connect() as connection:
                started = time.perf_counter()
                for _ in range(n):
                    connection.execute("INSERT INTO jobs (status) VALUES (0)")
                return {"seconds": time.perf_counter() - started, "durability": "synchronous_commit=on"}
        connection = self.connect()
        started = time.perf_counter()
        for _ in range(n):
            connection.execute("BEGIN IMMEDIATE")
            connection.execute("INSERT INTO jobs (status) VALUES (0)")
            connection.execute("COMMIT")
        seconds = time.perf_counter() - started
        durability = sqlite_durability(connection)
        connection.close()
        return {"seconds": seconds, "durability": durability}

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        stop = sigterm_event()
        owner = f"limit-{counter.slot}"
        if self.backend == "postgres":
            pg = self.pg_connect()

            def pg_loop() -> None:
                while not stop.is_set():
                    row = pg.execute(PG_CLAIM, (owner,)).fetchone()
                    if row is None:
                        time.sleep(0.001)
                        continue
                    pg.execute("UPDATE jobs SET status = 2 WHERE id = %s", (row[0],))
                    counter.bump()
                pg.close()

            return pg_loop
        connection = self.connect()

        def loop() -> None:
            while not stop.is_set():
                connection.execute("BEGIN IMMEDIATE")
                row = connection.execute(CLAIM, (owner,)).fetchone()
                connection.execute("COMMIT")
                if row is None:
                    time.sleep(0.001)
                    continue
                connection.execute("BEGIN IMMEDIATE")
                connection.execute("UPDATE jobs SET status = 2 WHERE id = ?", (row[0],))
                connection.execute("COMMIT")
                counter.bump()
            connection.close()

        return loop
