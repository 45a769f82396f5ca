"""The rows limit: the rows Tether's contract leaves written, put down as cheaply as SQLite allows.

The enqueue child builds three databases with Tether itself: ``base`` (the schema and the
project), ``queued`` (``n`` runs started one at a time) and ``drained`` (those runs drained by a
Runner, the throughput settings). Table by table, the difference between two of them is what the
contract had to write: the rows that appeared, the columns of rows that changed and the rows that
went. It then writes the difference between ``base`` and ``queued`` on a fresh copy of ``base``,
timed (the enqueue figure), and leaves the difference between ``queued`` and ``drained`` for the
worker, which writes it in transactions of ``runs_per_commit`` runs each, bumping the counter by
that many runs at each commit.

Every write is an ``executemany`` of one statement per table and shape (an insert of whole rows by
rowid, an update of one set of columns by rowid, a delete by rowid) on the same schema, with the
same pragmas (foreign keys on) and durability: no reads, no intermediate states (a row that changed
twice is written once, in its final state), no journal lock, no claim to re-check, one commit per
``runs_per_commit`` runs. An implementation that leaves these rows has this much writing to do and
more (it must also read, check claims and commit a claim before running its node), so in practice
this bounds its drain from above, however its statements are shaped. The writes are one stream:
with two workers, the second one idles.
"""

from __future__ import annotations

import pickle
import sqlite3
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from bench.common import Counter, copy_sqlite, sqlite_durability
from bench.peers import sigterm_event
from bench.peers.base import Peer
from bench.peers.replay_peer import Executed


class Write(NamedTuple):
    """One statement's writes to one table, once per parameter row."""

    table: str
    #: "insert", "parent insert" (rows a foreign key may refer to), "update" or "delete".
    kind: str
    sql: str
    #: The columns a parameter row gives values for, in order (an update's key columns last).
    columns: list[str]
    #: The columns that name a row.
    key: list[str]
    rows: list[tuple[Any, ...]]


#: Tables whose rows are the database's own bookkeeping (written by SQLite itself or by migrations).
SKIPPED = ("sqlite_sequence", "sqlite_stat1", "schema_migrations")


@dataclass
class Table:
    """One table's rows at a moment: every column (what an insert writes), the columns that name a
    row, and each row by its key."""

    name: str
    columns: list[str]
    key: list[str]
    rows: dict[tuple[Any, ...], tuple[Any, ...]]


def ordered(names: list[str], parents: dict[str, set[str]]) -> list[str]:
    """``names`` with each table after the tables its foreign keys refer to."""
    done: list[str] = []
    while len(done) < len(names):
        ready = [n for n in names if n not in done and parents[n] - {n} <= set(done)]
        if not ready:
            raise RuntimeError(f"foreign keys form a cycle among {sorted(set(names) - set(done))}")
        done += ready
    return done


def sqlite_tables(path: Path) -> tuple[list[Table], set[str]]:
    """Every data table of a SQLite database (rows by rowid), parents first; and the tables some
    foreign key refers to."""
    connection = sqlite3.connect(path)
    try:
        names = [
            row[0]
            for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if row[0] not in SKIPPED
        ]
        parents = {
            name: {row[2] for row in connection.execute(f"PRAGMA foreign_key_list({name})")} for name in names
        }
        tables = []
        for name in ordered(names, parents):
            (schema,) = connection.execute("SELECT sql FROM sqlite_master WHERE name = ?", (name,)).fetchone()
            if "WITHOUT ROWID" in str(schema).upper():
                # No rowid: its rows are known by their primary key.
                info = connection.execute(f"PRAGMA table_info({name})").fetchall()
                key = [row[1] for row in sorted((r for r in info if r[5]), key=lambda r: r[5])]
                cursor = connection.execute(f"SELECT * FROM {name}")
                columns = [d[0] for d in cursor.description]
                at = [columns.index(column) for column in key]
                rows = {tuple(row[i] for i in at): tuple(row) for row in cursor}
                tables.append(Table(name, columns, key, rows))
                continue
            cursor = connection.execute(f"SELECT rowid, * FROM {name}")
            columns = [d[0] for d in cursor.description]
            tables.append(Table(name, columns, ["rowid"], {(row[0],): tuple(row) for row in cursor}))
    finally:
        connection.close()
    return tables, set().union(*parents.values())


def difference(before: list[Table], after: list[Table], referenced: set[str], mark: str) -> list[Write]:
    """What turns ``before`` into ``after`` (the same tables in the same order), with ``mark`` as
    the parameter placeholder: inserts (parents first), then updates, then deletes (children
    first)."""
    inserts: list[Write] = []
    updates: list[Write] = []
    deletes: list[Write] = []
    for old, new in zip(before, after, strict=True):
        table, columns = new.name, new.columns
        where = " AND ".join(f"{column} = {mark}" for column in new.key)
        added = [row for key, row in new.rows.items() if key not in old.rows]
        if added:
            marks = ", ".join([mark] * len(columns))
            kind = "parent insert" if table in referenced else "insert"
            sql = f"INSERT INTO {table}({', '.join(columns)}) VALUES ({marks})"
            inserts.append(Write(table, kind, sql, columns, new.key, added))
        shapes: dict[tuple[int, ...], list[tuple[Any, ...]]] = {}
        for key, row in new.rows.items():
            was = old.rows.get(key)
            if was is None or was == row:
                continue
            changed = tuple(i for i, (a, b) in enumerate(zip(was, row, strict=True)) if a != b)
            shapes.setdefault(changed, []).append((*(row[i] for i in changed), *key))
        for changed, rows in shapes.items():
            sets = ", ".join(f"{columns[i]} = {mark}" for i in changed)
            sql = f"UPDATE {table} SET {sets} WHERE {where}"
            changed_columns = [columns[i] for i in changed]
            updates.append(Write(table, "update", sql, [*changed_columns, *new.key], new.key, rows))
        gone = [key for key in old.rows if key not in new.rows]
        if gone:
            deletes.append(
                Write(table, "delete", f"DELETE FROM {table} WHERE {where}", new.key, new.key, gone)
            )
    return [*inserts, *updates, *reversed(deletes)]


def sqlite_difference(before: Path, after: Path) -> list[Write]:
    old, _ = sqlite_tables(before)
    new, referenced = sqlite_tables(after)
    return difference(old, new, referenced, "?")


def chunks(writes: list[Write], parts: int) -> Iterator[list[Write]]:
    """The writes split into ``parts`` transactions, each taking its share of every table's rows.
    New rows of a table that a foreign key refers to all go into the first one, so no part refers
    to a row a later one writes."""
    for part in range(parts):
        batch = []
        for change in writes:
            if change.kind == "parent insert":
                share = change.rows if part == 0 else []
            else:
                share = change.rows[len(change.rows) * part // parts : len(change.rows) * (part + 1) // parts]
            if share:
                batch.append(change._replace(rows=share))
        yield batch


def drain_figures(drain: list[Write], n: int, parts: int) -> dict[str, float]:
    """What the results record of a drain's writes, per run."""
    return {
        "rows_per_run": sum(len(change.rows) for change in drain) / n,
        "statements_per_run": sum(len(batch) for batch in chunks(drain, parts)) / n,
        "commits_per_run": parts / n,
    }


def counting_commits(counter: Counter, runs: int, parts: int) -> Callable[[int], None]:
    """A ``committed(part)`` that bumps ``counter`` by the runs each of ``parts`` commits finished."""

    def committed(part: int) -> None:
        for _ in range(runs * (part + 1) // parts - runs * part // parts):
            counter.bump()

    return committed


def write(
    path: str, writes: list[Write], parts: int, synchronous: str, committed: Callable[[int], None]
) -> None:
    """Apply ``writes`` on ``path`` in ``parts`` transactions; ``committed(part)`` after each."""
    connection = _connect(path, synchronous)
    try:
        for part, batch in enumerate(chunks(writes, parts)):
            connection.execute("BEGIN IMMEDIATE")
            for change in batch:
                connection.executemany(change.sql, change.rows)
            connection.execute("COMMIT")
            committed(part)
    finally:
        connection.close()


def _connect(path: str, synchronous: str) -> sqlite3.Connection:
    connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    connection.execute("PRAGMA journal_mode = WAL")
    connection.execute(f"PRAGMA synchronous = {synchronous}")
    connection.execute("PRAGMA foreign_keys = ON")
    return connection


class RowsPeer(Peer):
    key = "rows"
    requires = ("tether",)
    worker_note = (
        "the rows a real Tether drain left written, written again with one executemany per table and "
        "shape, runs_per_commit runs per transaction (one stream; a second worker idles)"
    )

    @property
    def label(self) -> str:
        return f"rows limit (sqlite {self.synchronous}, {self.runs_per_commit} runs per commit)"

    @property
    def synchronous(self) -> str:
        return str(self.options.get("synchronous", "FULL"))

    @property
    def runs_per_commit(self) -> int:
        return int(self.options.get("runs_per_commit", 64))

    @property
    def path(self) -> Path:
        return self.workdir / "rows.db"

    def url(self, path: Path) -> str:
        query = "" if self.synchronous == "FULL" else f"?synchronous={self.synchronous}"
        return f"sqlite:///{path}{query}"

    def done_count(self, counter: Counter, n: int) -> int:
        with sqlite3.connect(self.path, timeout=30) as connection:
            return int(
                connection.execute("SELECT count(*) FROM run_queue WHERE status = 'done'").fetchone()[0]
            )

    def enqueue_here(self, n: int) -> dict[str, Any]:
        from bench.peers import tether_peer
        from bench.peers.tether_peer import workflow
        from tether.client import Tether
        from tether.engine.runner import Runner, RunnerConfig

        base, queued, drained = (self.workdir / f"{name}.db" for name in ("base", "queued", "drained"))
        Tether(self.url(base), workflows=[workflow()]).store.close()
        copy_sqlite(base, queued)
        client = Tether(self.url(queued), workflows=[workflow()])
        for _ in range(n):
            client.start("noop")
        client.store.close()
        copy_sqlite(queued, drained)
        executed = Executed()
        tether_peer.COUNTER = executed  # type: ignore[assignment]
        client = Tether(self.url(drained), workflows=[workflow()])
        config = RunnerConfig(
            concurrency=int(self.options.get("concurrency", 4)), poll_ms=int(self.options.get("poll_ms", 10))
        )
        Runner(client.store, client.registry, config=config).run(stop_when=lambda: executed.count >= n)
        client.store.close()
        starts, drain = sqlite_difference(base, queued), sqlite_difference(queued, drained)
        with open(self.workdir / "drain.pickle", "wb") as out:
            pickle.dump(drain, out)
        copy_sqlite(base, self.path)
        parts = max(1, n // self.runs_per_commit)
        started = time.perf_counter()
        write(str(self.path), starts, parts, self.synchronous, lambda part: None)
        seconds = time.perf_counter() - started
        connection = _connect(str(self.path), self.synchronous)
        durability = sqlite_durability(connection)
        connection.close()
        return {"seconds": seconds, "durability": durability, **drain_figures(drain, n, parts)}

    def worker_here(self, counter: Counter) -> Callable[[], None]:
        stop = sigterm_event()
        if counter.slot > 0:
            return lambda: stop.wait()
        with open(self.workdir / "drain.pickle", "rb") as source:
            drain: list[Write] = pickle.load(source)
        runs = self.done_target()
        parts = max(1, runs // self.runs_per_commit)
        committed = counting_commits(counter, runs, parts)

        def loop() -> None:
            write(str(self.path), drain, parts, self.synchronous, committed)
            stop.wait()

        return loop

    def done_target(self) -> int:
        """How many runs the drain finishes (the queued runs of the fresh copy)."""
        with sqlite3.connect(self.path, timeout=30) as connection:
            return int(connection.execute("SELECT count(*) FROM run_queue").fetchone()[0])
