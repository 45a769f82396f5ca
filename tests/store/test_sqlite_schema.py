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
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tether import open_store
from tether.client import Tether
from tether.engine.graph import Workflow, compute
from tether.engine.runner import Runner, RunnerConfig
from tether.errors import Conflict, StoreError
from tether.store import ScheduleSpec
from tether.store.db import load_queries, migrations, sql_statements

from .readers import to_version_6

#: The write queries that do open temporary tables, and how many; every other opens none.
EXPECTED_TEMPORARY_TABLES = {
    # RETURNING: SQLite buffers the returned rows (the journal's inserts, the most frequent
    # writes, read the connection's last rowid instead).
    "interval_open": 1,
    "viewer_advance": 1,
    # Several rows chosen through an index the statement changes, or through a subquery over
    # another table, are collected first (cancels, deletes, the blob prune).
    "attempt_end_active": 1,
    "request_cancel_pending": 1,
    "message_cancel_pending": 1,
    "decision_cancel_open": 1,
    "decision_expire_open": 1,
    "submission_reject_for_request": 1,
    "submission_reject_for_run": 2,
    "interval_close_run": 2,
    "run_delete_effect_resources": 1,
    "run_delete_events": 1,
    "blob_prune": 2,
    # Retention: the same deletes as run_delete_*, and the blob prune for one candidate.
    "prune_delete_effect_resources": 1,
    "prune_delete_events": 1,
    "prune_blob_delete": 2,
    # A fork copies its parent's attempts within node_attempts: the rows read are collected before
    # they are inserted (once per copied step of a fork, not a hot path).
    "attempt_copy": 1,
}


def temporary_tables(connection: sqlite3.Connection, sql: str) -> int:
    """How many temporary tables SQLite's program for ``sql`` opens."""
    params = {name: None for name in re.findall(r":(\w+)", sql)}
    return [row[1] for row in connection.execute("EXPLAIN " + sql, params)].count("OpenEphemeral")


def store_connection(path: Path) -> sqlite3.Connection:
    """A connection set up as the store's are (foreign keys on: their checks are in the programs)."""
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA foreign_keys = ON")
    return connection


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
        return {
            name: connection.execute(f"SELECT * FROM {name} ORDER BY {_order(connection, name)}").fetchall()
            for name in names
        }


def _order(connection: sqlite3.Connection, table: str) -> str:
    """What orders a table's rows: its rowid, or a ``WITHOUT ROWID`` table's primary key."""
    without_rowid = connection.execute("SELECT wr FROM pragma_table_list WHERE name = ?", (table,)).fetchone()
    if without_rowid is None or not without_rowid[0]:
        return "rowid"
    info = connection.execute(f"PRAGMA table_info({table})").fetchall()
    return ", ".join(row[1] for row in sorted(info, key=lambda row: row[5]) if row[5])


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


#: The viewer's run rows as migration 5 defined them (migration 13 adds the parent link).
RUN_VIEWS_BEFORE_13 = """
CREATE VIEW run_views AS
SELECT r.run_id, d.workflow_name, r.workflow_ref, r.status AS run_status, r.paused,
       r.definition_digest, q.status, b.origin_session_id, b.execution_mode, r.parent_run_id,
       r.root_run_id, r.lineage_kind, r.restart_number, r.parent_run_revision, q.error_code,
       CAST(error.content AS TEXT) AS error_message, q.created_at, q.updated_at, q.started_at,
       q.finished_at, source.source_type, source.source_ref, source.source_revision
FROM runs r JOIN workflow_definitions d ON d.definition_digest = r.definition_digest
JOIN run_queue q ON q.run_id = r.run_id
JOIN run_bindings b ON b.run_id = r.run_id
JOIN run_sources source ON source.run_id = r.run_id AND source.mount_path = ''
LEFT JOIN blobs error ON error.blob_hash = q.error_hash
"""

#: The schema changes of later migrations that add columns or tables, undone when an earlier one is
#: forgotten: a re-applied migration that rebuilds a table copies its rows column by column.
UNDO = {
    9: ("DROP TABLE workers", "ALTER TABLE run_queue DROP COLUMN cancel_requested_at"),
    10: ("DROP INDEX IF EXISTS run_queue_finished",),
    11: (
        "DROP TABLE IF EXISTS schedules",
        "DROP TABLE IF EXISTS run_inbox",
        "DROP TABLE IF EXISTS run_event_waits",
    ),
    12: (
        "DROP INDEX IF EXISTS run_queue_limit",
        "ALTER TABLE run_queue DROP COLUMN limit_max",
        "ALTER TABLE run_queue DROP COLUMN limit_key",
    ),
    13: ("DROP VIEW run_views", "DROP TABLE IF EXISTS run_children", RUN_VIEWS_BEFORE_13),
}


def forget_migration(path: Path, version: int) -> None:
    """Make the database look as if ``version`` and every later migration were never applied
    (migration 7's viewer layout is written back as version 6 had it)."""
    with open_store(f"sqlite:///{path}") as store:
        to_version_6(store)
    with sqlite3.connect(path) as connection:
        for later in sorted((v for v in UNDO if v >= max(version, 8)), reverse=True):
            for statement in UNDO[later]:
                connection.execute(statement)
        connection.execute("DELETE FROM schema_migrations WHERE version >= ?", (version,))


def test_sqlite_schema__writing_any_column_of_any_table_opens_no_temporary_table(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path / 't.db'}").close()
    with store_connection(tmp_path / "t.db") as connection:
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
            key = (
                " AND ".join(f"{row[1]} = :{row[1]}" for row in info if row[5])
                if _order(connection, table) != "rowid"
                else "rowid = :row"
            )
            assert temporary_tables(connection, f"UPDATE {table} SET {changes} WHERE {key}") == 0, table


def test_sqlite_queries__writes_open_no_temporary_table_but_the_listed_ones(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path / 't.db'}").close()
    found = {}
    with store_connection(tmp_path / "t.db") as connection:
        for name, body in load_queries("sqlite").items():
            statements = sql_statements(body)
            if any(s.split(None, 1)[0].upper() in ("INSERT", "UPDATE", "DELETE") for s in statements):
                found[name] = sum(temporary_tables(connection, statement) for statement in statements)
    assert "queue_set_status" in found and "lease_take_next" in found
    assert {name: count for name, count in found.items() if count} == EXPECTED_TEMPORARY_TABLES


def test_sqlite_queries__the_claim_opens_no_temporary_table(tmp_path: Path) -> None:
    open_store(f"sqlite:///{tmp_path / 't.db'}").close()
    queries = load_queries("sqlite")
    with store_connection(tmp_path / "t.db") as connection:
        for name in ("run_claim_next", "run_claim_next_global"):
            assert temporary_tables(connection, queries[name]) == 0, name


def test_sqlite_schema__an_in_list_of_three_values_opens_a_temporary_table() -> None:
    # What the checks above look for, seen where it happens (the version-1 constraints had these).
    with sqlite3.connect(":memory:") as connection:
        connection.execute(
            "CREATE TABLE t (x TEXT CHECK (x IN ('a', 'b', 'c')), y TEXT CHECK (y = 'a' OR y = 'b'))"
        )
        assert temporary_tables(connection, "UPDATE t SET x = :x") == 1
        assert temporary_tables(connection, "UPDATE t SET y = :y") == 0


def test_sqlite_migration_5__rebuilds_the_tables_keeping_every_row_and_the_journal_sequence(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.db"
    store_with_finished_runs(path)
    before = dump(path)  # before the later migrations' columns are undone too
    forget_migration(path, 5)
    forgotten = dump(path)  # version 6's layout of the viewer and the journal
    assert forgotten["events"] and forgotten["viewer_deltas"] and forgotten["node_attempts"]
    last_seq = dict(forgotten["sqlite_sequence"])["events"]

    with open_store(f"sqlite:///{path}") as store:  # applies migration 5 again, to stored runs
        latest = migrations("sqlite")[-1][0]
        assert store.db.schema_version() == (latest, latest)
        assert len(store.list_runs()) == 3

    after = dump(path)
    # Every row is kept; migration 7 (applied again after 5) changes the viewer's layout and
    # gives journal entries a column of their own for the payload (empty in the stored ones).
    # Migration 9's column and table and the tables of 11 and 13 (undone above) come back as they were.
    changed = {
        "schema_migrations",
        "viewer_deltas",
        "viewer_revisions",
        "events",
        "run_queue",
        "workers",
        "schedules",
        "run_inbox",
        "run_event_waits",
        "run_children",
    }
    assert {name: rows for name, rows in after.items() if name not in changed} == {
        name: rows for name, rows in forgotten.items() if name not in changed
    }
    assert after["run_queue"] == before["run_queue"]
    assert after.get("workers") == before.get("workers")
    for table in ("schedules", "run_inbox", "run_event_waits"):
        assert after.get(table) == before.get(table)
    assert after.get("run_children") == before.get("run_children")
    assert [row[:-1] for row in after["events"]] == forgotten["events"]
    assert {row[-1] for row in after["events"]} == {None}
    assert len(after["viewer_revisions"]) == len({(r[0], r[1]) for r in forgotten["viewer_deltas"]})
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


def test_sqlite_migrations_7_to_10__upgrade_a_drained_store_in_place(tmp_path: Path) -> None:
    """A store of version 6 (runs drained by a real runner) is upgraded by opening it: the journal
    carries on after its last entry and prune finds the finished runs by the new index."""
    path = tmp_path / "t.db"
    store_with_finished_runs(path)
    with sqlite3.connect(path) as connection:
        connection.execute("DROP INDEX run_queue_finished")
    forget_migration(path, 8)
    before = dump(path)
    last_seq = dict(before["sqlite_sequence"])["events"]
    with open_store(f"sqlite:///{path}") as store:
        latest = migrations("sqlite")[-1][0]
        assert store.db.schema_version() == (latest, latest)
        assert [e.seq for e in store.events_after(0, limit=1000)] == list(range(1, last_seq + 1))
        from tests.store.conftest import reserve_args

        store.reserve(**reserve_args("after-upgrade", origin_session_id="s-after", now=None))
        assert store.last_event_seq() == last_seq + 1
        report = store.prune(finished_before=store.now())
        assert report.runs == 3 and [r.run_id for r in store.list_runs()] == ["after-upgrade"]
    with sqlite3.connect(path) as connection:
        plan = connection.execute(
            "EXPLAIN QUERY PLAN SELECT run_id FROM run_queue "
            "WHERE finished_at IS NOT NULL AND finished_at < 5 ORDER BY finished_at, run_id"
        ).fetchall()
        assert any("run_queue_finished" in str(row) for row in plan)
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []


def test_sqlite_migration_11__adds_schedules_and_run_events_to_a_drained_store(tmp_path: Path) -> None:
    """A store of version 10 (runs drained by a real runner, no schedules or run inbox tables)
    is upgraded by opening it: its runs stay, schedules can be added and fired, and a finished
    run refuses events."""
    path = tmp_path / "t.db"
    store_with_finished_runs(path)
    forget_migration(path, 11)
    before = dump(path)
    assert not {"schedules", "run_inbox", "run_event_waits"} & set(before)
    with open_store(f"sqlite:///{path}") as store:
        latest = migrations("sqlite")[-1][0]
        assert store.db.schema_version() == (latest, latest)
        assert len(store.list_runs()) == 3
        added = store.schedule_add(ScheduleSpec("nightly", "noop", "0 2 * * *", "UTC", None, "skip"))
        assert store.schedule_advance(
            name="nightly", expected_due=added.next_due_at, next_due=added.next_due_at + timedelta(days=1)
        )
        finished = store.list_runs()[0].run_id
        with pytest.raises(Conflict, match="takes no more events"):
            store.event_send(run_id=finished, name="go", payload=None)
    after = dump(path)
    new = ("schedules", "run_inbox", "run_event_waits", "run_children", "schema_migrations")
    kept = {name: rows for name, rows in after.items() if name not in new}
    # Migration 12, forgotten with 11, adds its two columns back at the end of run_queue's rows.
    assert all(row[-2:] == (None, None) for row in kept["run_queue"])
    kept["run_queue"] = [row[:-2] for row in kept["run_queue"]]
    assert kept == {name: rows for name, rows in before.items() if name != "schema_migrations"}
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA foreign_key_check").fetchall() == []
