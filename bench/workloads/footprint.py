"""What a no-op run leaves written: rows per table, statements and commits, bytes of database.

A child process starts ``runs`` runs of a no-op workflow of ``steps`` nodes, each with its own
``Tether.start`` call (as a user starts them), and drains them with one real ``Runner``. It
counts, from the first start to the last run done:

- the rows each table holds more afterwards (``rows_left``, per run);
- on SQLite, every row inserted, updated or deleted (``row_writes``, per run, by table), counted
  by temporary triggers in a second pass of its own so that the counting writes no bytes into
  the first pass's file;
- statements sent (a ``run_many`` counts one per row) and write transactions (commits);
- on SQLite, the database file's size after a checkpoint (as a drain leaves it, free pages and
  all), less its size before the runs, divided by the runs (``bytes_per_run``).

``python -m bench.workloads.footprint [runs]`` prints both workflow sizes on SQLite (and
PostgreSQL when ``TETHER_BENCH_PG`` names a server's database URL).
"""

from __future__ import annotations

import collections
import itertools
import json
import os
import sqlite3
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def workflow(steps: int) -> Any:
    from tether.engine.graph import Workflow, compute

    names = [f"s{n}" for n in range(steps)]
    return Workflow(
        f"noop{steps}",
        start=names[0],
        nodes=[compute(name, lambda ctx: None) for name in names],
        edges=dict(itertools.pairwise(names)),
    )


def _count(db: Any, counts: collections.Counter[str]) -> None:
    """Count outermost write transactions and the statements sent through ``db``."""
    transaction = db.transaction

    @contextmanager
    def counted(*, write: bool = True, first: bool = False) -> Iterator[None]:
        if not db.in_transaction:
            counts["commits" if write else "read transactions"] += 1
        with transaction(write=write, first=first):
            yield

    db.transaction = counted
    inside = threading.local()
    for name in ("one", "all", "run", "queue", "expect", "run_many", "each"):
        original = getattr(db, name)

        def wrapper(*args: Any, _original: Any = original, _name: str = name, **params: Any) -> Any:
            if getattr(inside, "depth", 0):
                return _original(*args, **params)
            if _name == "each":
                sent = len(args[0])
            elif _name == "run_many":
                sent = len(args[1])
            else:
                sent = 1
            counts["statements"] += sent
            for query in [q for q, _ in args[0]] if _name == "each" else [args[0]]:
                counts["query " + query] += sent if _name == "run_many" else 1
            inside.depth = 1
            try:
                return _original(*args, **params)
            finally:
                inside.depth = 0

        setattr(db, name, wrapper)


def _tables_sqlite(path: str) -> list[str]:
    with sqlite3.connect(path) as connection:
        return [
            row[0]
            for row in connection.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'"
                " AND name != 'schema_migrations'"
            )
        ]


def _rows(url: str, path: str | None) -> dict[str, int]:
    if path is not None:
        with sqlite3.connect(path) as connection:
            return {
                table: int(connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])
                for table in _tables_sqlite(path)
            }
    import psycopg

    with psycopg.connect(url) as connection:
        tables = [
            row[0]
            for row in connection.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            ).fetchall()
        ]
        return {
            table: int(connection.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])  # type: ignore[index]
            for table in tables
        }


def _size(path: str) -> int:
    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return os.path.getsize(path)


def _triggers(path: str) -> None:
    """Count every row write per table into ``footprint_writes`` (temporary analysis only)."""
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE footprint_writes (name TEXT PRIMARY KEY, n INTEGER NOT NULL)")
        for table in _tables_sqlite(path):
            if table == "footprint_writes":
                continue
            for action in ("INSERT", "UPDATE", "DELETE"):
                connection.execute(
                    f'CREATE TRIGGER "footprint_{table}_{action}" AFTER {action} ON "{table}" BEGIN '
                    f"INSERT INTO footprint_writes VALUES ('{table} {action.lower()}', 1) "
                    "ON CONFLICT(name) DO UPDATE SET n = n + 1; END"
                )


def measure(url: str, runs: int, steps: int, *, count_writes: bool = False) -> dict[str, Any]:
    """Start and drain ``runs`` runs of ``steps`` no-op nodes on a fresh store at ``url``."""
    from tether.client import Tether
    from tether.engine.runner import Runner, RunnerConfig

    path = url.removeprefix("sqlite:///") if url.startswith("sqlite:") else None
    client = Tether(url, workflows=[workflow(steps)])
    client.start(f"noop{steps}", run_id="warm-up")  # the project, definition and shared blobs
    Runner(client.store, client.registry, config=RunnerConfig(concurrency=1, poll_ms=10)).run(
        stop_when=lambda: True
    )
    if count_writes:
        assert path is not None
        _triggers(path)
    before = _rows(url, path)
    size_before = _size(path) if path is not None and not count_writes else 0
    counts: collections.Counter[str] = collections.Counter()
    _count(client.store.db, counts)
    for n in range(runs):
        client.start(f"noop{steps}", run_id=f"run-{n}")
    Runner(client.store, client.registry, config=RunnerConfig(concurrency=1, poll_ms=10)).run(
        stop_when=lambda: True
    )
    client.store.close()
    after = _rows(url, path)
    left = {t: (after.get(t, 0) - before.get(t, 0)) / runs for t in sorted(after)}
    result: dict[str, Any] = {
        "runs": runs,
        "steps": steps,
        "rows_left_per_run": round(sum(left.values()), 2),
        "rows_left_by_table": {t: round(v, 2) for t, v in left.items() if v},
        "statements_per_run": round(counts["statements"] / runs, 2),
        "commits_per_run": round(counts["commits"] / runs, 2),
        "read_transactions_per_run": round(counts["read transactions"] / runs, 2),
        "statements_by_query": {
            k[6:]: round(v / runs, 2) for k, v in counts.most_common() if k.startswith("query ")
        },
    }
    if path is not None:
        with sqlite3.connect(path) as connection:
            finished = connection.execute("SELECT count(*) FROM run_queue WHERE status = 'done'").fetchone()[
                0
            ]
            result["runs_done"] = int(finished) - 1
            if count_writes:
                writes = dict(connection.execute("SELECT name, n FROM footprint_writes").fetchall())
                result["row_writes_per_run"] = round(sum(writes.values()) / runs, 2)
                result["row_writes_by_table"] = {k: round(v / runs, 2) for k, v in sorted(writes.items())}
        if not count_writes:
            result["bytes_per_run"] = round((_size(path) - size_before) / runs)
    return result


def footprint(url_for: Any, runs: int, steps: int) -> dict[str, Any]:
    result = measure(url_for("a"), runs, steps)
    if result.get("runs_done") is not None:
        writes = measure(url_for("b"), runs, steps, count_writes=True)
        result["row_writes_per_run"] = writes["row_writes_per_run"]
        result["row_writes_by_table"] = writes["row_writes_by_table"]
    return result


def main() -> None:
    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    report: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        for steps in (1, 5):
            report[f"sqlite, {steps} step(s)"] = footprint(
                lambda tag, steps=steps: f"sqlite:///{Path(folder) / f'{steps}-{tag}.db'}", runs, steps
            )
    pg = os.environ.get("TETHER_BENCH_PG")
    if pg:
        for steps in (1, 5):
            report[f"postgres, {steps} step(s)"] = measure(pg, runs, steps)
            _reset_pg(pg)
    print(json.dumps(report, indent=2))


def _reset_pg(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as connection:
        connection.execute("DROP SCHEMA public CASCADE")
        connection.execute("CREATE SCHEMA public")


if __name__ == "__main__":
    main()
