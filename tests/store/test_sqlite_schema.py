"""SQLite only: the write path opens no temporary tables, and migration 5, which rewrote the
constraints that did, keeps every row.

SQLite builds a temporary table for an ``IN`` list of three or more values and frees it when the
statement ends; in a CHECK constraint or a partial index's condition that happened on every insert
or update of the row, and the allocations cost a long-running process more than the statements
themselves (migration ``0005_constraints_without_in_lists.sql``).
"""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from tether import open_store
from tether.client import Tether
from tether.engine.graph import Workflow, compute
from tether.engine.runner import Runner, RunnerConfig
from tether.errors import StoreError
from tether.store.db import load_queries, migrations, sql_statements

#: The statements a run's every step goes through: its status moves and the claim.
STATUS_MOVES = (
    "run_claim_next",
    "run_claim_next_global",
    "lease_take_next",
    "queue_set_status",
    "queue_park_with_error",
    "queue_finish",
    "queue_requeue",
    "run_set_status",
    "run_set_detail",
    "run_set_paused",
    "attempt_finish",
    "attempt_set_waiting",
)


def temporary_tables(connection: sqlite3.Connection, sql: str) -> int:
    """How many temporary tables SQLite's program for ``sql`` opens."""
    params = {name: None for name in re.findall(r":(\w+)", sql)}
    return [row[1] for row in connection.execute("EXPLAIN " + sql, params)].count("OpenEphemeral")


def user_tables(connection: sqlite3.Connection) -> list[str]:
    return [
        name
        for (name,) in connection.execute(
            "SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
    ]


def dump(path: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table (the AUTOINCREMENT counters too), in rowid order."""
    with sqlite3.connect(path) as connection:
        names = [*user_tables(connection), "sqlite_sequence"]
        return {name: connection.execute(f"SELECT * FROM {name} ORDER BY rowid").fetchall() for name in names}


def noop(ctx: Any) -> dict[str, int]:
    return {"done": 1}


def store_with_finished_runs(path: Path, runs: int = 3) -> None:
    """A store that a real runner drained: runs, attempts, journal, viewer rows, leases."""
    client = Tether(f"sqlite:///{path}", workflows=[Workflow("noop", start="a", nodes=[compute("a", noop)])])
    for _ in range(runs):
        client.start("noop")
    Runner(client.store, client.registry, config=RunnerConfig(poll_ms=10)).run(stop_when=lambda: True)
    assert {run.status for run in client.store.list_runs()} == {"done"}
    client.store.close()


def forget_migration(path: Path, version: int) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("DELETE FROM schema_migrations WHERE version = ?", (version,))


def test_sqlite_schema__writing_any_column_of_any_table_opens_no_temporary_table(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path / 't.db'}").close()
    with sqlite3.connect(tmp_path / "t.db") as connection:
        tables = user_tables(connection)
        assert "run_queue" in tables and "events" in tables
        for table in tables:
            info = connection.execute(f"PRAGMA table_info({table})").fetchall()
            columns = [row[1] for row in info]
            names = ", ".join(columns)
            values = ", ".join(f":{column}" for column in columns)
            # Every column but the primary key, which no statement of ours changes.
            changes = ", ".join(f"{row[1]} = :{row[1]}" for row in info if not row[5])
            assert temporary_tables(connection, f"INSERT INTO {table} ({names}) VALUES ({values})") == 0, (
                table
            )
            assert temporary_tables(connection, f"UPDATE {table} SET {changes} WHERE rowid = :row") == 0, (
                table
            )


def test_sqlite_queries__status_moves_and_claims_open_no_temporary_table(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path / 't.db'}").close()
    queries = load_queries("sqlite")
    with sqlite3.connect(tmp_path / "t.db") as connection:
        for name in STATUS_MOVES:
            for statement in sql_statements(queries[name]):
                assert temporary_tables(connection, statement) == 0, name


def test_sqlite_schema__the_old_constraints_opened_temporary_tables(tmp_path: Path) -> None:
    # The measurement behind migration 5: the version-1 queue table's status update did open them.
    with sqlite3.connect(tmp_path / "old.db") as connection:
        for version, sql in migrations("sqlite"):
            if version < 5:
                for statement in sql_statements(sql):
                    connection.execute(statement)
        assert (
            temporary_tables(connection, "UPDATE run_queue SET status = :status WHERE run_id = :run_id") >= 3
        )


def test_sqlite_migration_5__rebuilds_the_tables_keeping_every_row_and_the_journal_sequence(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    store_with_finished_runs(path)
    forget_migration(path, 5)
    before = dump(path)
    assert before["events"] and before["viewer_deltas"] and before["node_attempts"]
    last_seq = dict(before["sqlite_sequence"])["events"]

    with open_store(f"sqlite:///{path}") as store:  # applies migration 5 again, to stored runs
        assert store.db.schema_version() == (5, 5)
        assert len(store.list_runs()) == 3

    after = dump(path)
    assert {name: rows for name, rows in after.items() if name != "schema_migrations"} == {
        name: rows for name, rows in before.items() if name != "schema_migrations"
    }
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
        assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
        schema = "\n".join(
            sql for (sql,) in connection.execute("SELECT sql FROM sqlite_schema WHERE sql IS NOT NULL")
        )
        assert "status IN ('queued'" not in schema and "(status = 'queued' OR" in schema
        assert connection.execute("SELECT count(*) FROM run_views").fetchone() == (3,)

    # The journal carries on after its last entry.
    client = Tether(f"sqlite:///{path}", workflows=[Workflow("noop", start="a", nodes=[compute("a", noop)])])
    client.start("noop")
    with sqlite3.connect(path) as connection:
        assert (
            connection.execute(
                "SELECT min(event_seq) FROM events WHERE event_seq > ?", (last_seq,)
            ).fetchone()[0]
            == last_seq + 1
        )
    client.store.close()


def test_sqlite_migration__that_would_break_a_foreign_key_is_refused_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    store_with_finished_runs(path, runs=1)
    forget_migration(path, 5)
    with sqlite3.connect(path) as connection:  # a row whose run is gone (written with the checks off)
        connection.execute("INSERT INTO run_bindings VALUES ('no-such-run', 'session', 'headless', 0)")
    before = dump(path)

    with pytest.raises(StoreError, match=r"would break 1 foreign keys .*run_bindings.*nothing was changed"):
        open_store(f"sqlite:///{path}")

    assert dump(path) == before
    with sqlite3.connect(path) as connection:
        assert connection.execute("SELECT max(version) FROM schema_migrations").fetchone() == (4,)
