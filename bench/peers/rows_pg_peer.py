"""The rows limit on PostgreSQL: the rows Tether's contract leaves written, put down in bulk.

As ``rows_peer`` on SQLite: the enqueue child builds ``base`` (the schema and the project),
``queued`` (``n`` runs started one at a time) and ``drained`` (those runs drained by a Runner, the
throughput settings) with Tether itself, each a copy of the one before (``CREATE DATABASE ...
TEMPLATE``), and takes the difference between them table by table, rows named by their primary
keys. It writes the difference between ``base`` and ``queued`` on a fresh copy of ``base``, timed
(the enqueue figure), and the worker writes the difference between ``queued`` and ``drained`` in
transactions of ``runs_per_commit`` runs, bumping the counter at each commit: each transaction
pipelined (one round trip: an ``executemany`` per table and shape, then the commit) or, with
``copy``, through the server's bulk path (``COPY``; changed and removed rows copied into a
temporary table that one UPDATE or DELETE joins).

No reads, no intermediate states, no locks to wait for, no journal order to keep: in practice a
bound from above on the drain of any implementation that leaves these rows in this schema. The
writes are one stream: with two workers, the second one idles.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from typing import Any

from bench.common import PG_ADMIN, Counter, pg_count, pg_create, pg_drop, pg_dsn
from bench.peers import sigterm_event
from bench.peers.base import Peer
from bench.peers.replay_peer import Executed
from bench.peers.rows_peer import (
    SKIPPED,
    Table,
    Write,
    chunks,
    counting_commits,
    difference,
    drain_figures,
    ordered,
)

#: The databases a measurement uses, by role (``rows`` is the one the worker writes).
ROLES = ("base", "queued", "drained", "rows")

FOREIGN_KEYS = (
    "SELECT conrelid::regclass::text, confrelid::regclass::text FROM pg_constraint WHERE contype = 'f'"
)
PRIMARY_KEY = """
SELECT a.attname FROM pg_index i
JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s::regclass AND i.indisprimary
ORDER BY array_position(i.indkey::int2[], a.attnum)
"""


def pg_tables(database: str) -> tuple[list[Table], set[str]]:
    """Every table of the database (rows by primary key), parents first; and the tables some
    foreign key refers to."""
    import psycopg

    with psycopg.connect(pg_dsn(database)) as connection:
        names = [
            row[0]
            for row in connection.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
            if row[0] not in SKIPPED
        ]
        parents: dict[str, set[str]] = {name: set() for name in names}
        for child, parent in connection.execute(FOREIGN_KEYS):
            if child in parents:
                parents[child].add(parent)
        tables = []
        for name in ordered(names, parents):
            key = [row[0] for row in connection.execute(PRIMARY_KEY, (name,))]
            if not key:
                raise RuntimeError(f"table {name} has no primary key to name its rows by")
            cursor = connection.execute(f"SELECT * FROM {name}")
            columns = [column.name for column in cursor.description or ()]
            at = [columns.index(column) for column in key]
            rows = {tuple(row[i] for i in at): tuple(row) for row in cursor}
            tables.append(Table(name, columns, key, rows))
    return tables, set().union(*parents.values())


def pg_difference(before: str, after: str) -> list[Write]:
    old, _ = pg_tables(before)
    new, referenced = pg_tables(after)
    return difference(old, new, referenced, "%s")


def write(
    connection: Any, writes: list[Write], parts: int, copy: bool, committed: Callable[[int], None]
) -> None:
    """Apply ``writes`` in ``parts`` transactions; ``committed(part)`` after each. Each transaction
    goes out pipelined (an executemany per table and shape, one round trip), or with ``copy``
    through ``COPY`` (the server's bulk path): new rows copied into their table, changed and
    removed ones copied into a temporary table that one UPDATE or DELETE joins."""
    for part, batch in enumerate(chunks(writes, parts)):
        if copy:
            with connection.transaction():
                for number, change in enumerate(batch):
                    _copy_change(connection, change, f"rows_{number}")
        else:
            with connection.pipeline(), connection.transaction():
                cursor = connection.cursor()
                for change in batch:
                    cursor.executemany(change.sql, change.rows)
        committed(part)


def _copy_change(connection: Any, change: Write, scratch: str) -> None:
    columns = ", ".join(change.columns)
    target = change.table
    if change.kind.endswith("insert"):
        scratch = target
    else:
        connection.execute(
            f"CREATE TEMP TABLE {scratch} ON COMMIT DROP AS SELECT {columns} FROM {target} WITH NO DATA"
        )
    with connection.cursor().copy(f"COPY {scratch} ({columns}) FROM STDIN") as copy:
        for row in change.rows:
            copy.write_row(row)
    if change.kind == "update":
        sets = ", ".join(f"{column} = s.{column}" for column in change.columns if column not in change.key)
        joined = " AND ".join(f"t.{column} = s.{column}" for column in change.key)
        connection.execute(f"UPDATE {target} t SET {sets} FROM {scratch} s WHERE {joined}")
    elif change.kind == "delete":
        joined = " AND ".join(f"t.{column} = s.{column}" for column in change.key)
        connection.execute(f"DELETE FROM {target} t USING {scratch} s WHERE {joined}")


class RowsPgPeer(Peer):
    key = "rows-pg"
    backend = "postgres"
    requires = ("tether", "psycopg")
    worker_note = (
        "the rows a real Tether drain left written, written again with one executemany per table and "
        "shape (or with copy, COPY into the table or into a temporary table one UPDATE joins), "
        "runs_per_commit runs per transaction (one stream; a second worker idles)"
    )

    @property
    def label(self) -> str:
        how = "COPY" if self.copy else "executemany"
        return f"rows limit (postgres, {how}, {self.runs_per_commit} runs per commit)"

    @property
    def copy(self) -> bool:
        return bool(self.options.get("copy", False))

    @property
    def runs_per_commit(self) -> int:
        return int(self.options.get("runs_per_commit", 64))

    def prepare(self) -> None:
        super().prepare()
        base = pg_create("rows")
        self.options["databases"] = {role: base if role == "base" else f"{base}_{role}" for role in ROLES}

    def cleanup(self) -> None:
        for database in reversed(self.options.pop("databases", {}).values()):
            pg_drop(database)
        super().cleanup()

    def settings(self) -> dict[str, Any]:
        found = super().settings()
        found.pop("databases", None)
        return found

    def database(self, role: str) -> str:
        return str(self.options["databases"][role])

    def done_count(self, counter: Counter, n: int) -> int:
        return pg_count(self.database("rows"), "SELECT count(*) FROM run_queue WHERE status = 'done'")

    def _copy(self, source: str, target: str) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{self.database(target)}" TEMPLATE "{self.database(source)}"')

    def enqueue_here(self, n: int) -> dict[str, Any]:
        import psycopg

        from bench.peers import tether_peer
        from bench.peers.tether_peer import workflow
        from tether.client import Tether
        from tether.engine.runner import Runner, RunnerConfig

        Tether(pg_dsn(self.database("base")), workflows=[workflow()]).store.close()
        self._copy("base", "queued")
        self._copy("base", "rows")
        client = Tether(pg_dsn(self.database("queued")), workflows=[workflow()])
        for _ in range(n):
            client.start("noop")
        client.store.close()
        self._copy("queued", "drained")
        executed = Executed()
        tether_peer.COUNTER = executed  # type: ignore[assignment]
        client = Tether(pg_dsn(self.database("drained")), workflows=[workflow()])
        config = RunnerConfig(
            concurrency=int(self.options.get("concurrency", 4)), poll_ms=int(self.options.get("poll_ms", 10))
        )
        Runner(client.store, client.registry, config=config).run(stop_when=lambda: executed.count >= n)
        client.store.close()
        starts = pg_difference(self.database("base"), self.database("queued"))
        drain = pg_difference(self.database("queued"), self.database("drained"))
        with open(self.workdir / "drain.pickle", "wb") as out:
            pickle.dump(drain, out)
        parts = max(1, n // self.runs_per_commit)
        with psycopg.connect(pg_dsn(self.database("rows")), autocommit=True) as connection:
            started = time.perf_counter()
            write(connection, starts, parts, self.copy, lambda part: None)
            seconds = time.perf_counter() - started
            setting = connection.execute("SHOW synchronous_commit").fetchone()
        return {
            "seconds": seconds,
            "durability": f"synchronous_commit={setting[0] if setting else '?'}",
            **drain_figures(drain, n, parts),
        }

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        import psycopg

        stop = sigterm_event()
        if counter.slot > 0:
            return lambda: stop.wait()
        with open(self.workdir / "drain.pickle", "rb") as source:
            drain: list[Write] = pickle.load(source)
        connection = psycopg.connect(pg_dsn(self.database("rows")), autocommit=True)
        runs = pg_count(self.database("rows"), "SELECT count(*) FROM run_queue")
        parts = max(1, runs // self.runs_per_commit)
        committed = counting_commits(counter, runs, parts)

        def loop() -> None:
            write(connection, drain, parts, self.copy, committed)
            stop.wait()
            connection.close()

        return loop
