"""Migration 0009 (cancel requests, live workers) upgrades a populated store of the version
before it in place, on both backends: a cancel requested the old way (a journal event the runner
polled for) is carried over as a committed request."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tests import pg
from tether import open_store
from tether.client import Tether
from tether.engine.graph import Workflow, compute
from tether.errors import CancelRequested

#: Back to version 8: migration 9's table and column go, and the later migrations are forgotten
#: with it (10 an index, created only if missing; 11's tables, 12's columns and 13's table and
#: view dropped), so that every one of them is applied again.
FORGET_0009 = (
    "DROP TABLE workers",
    "DROP VIEW run_views",  # migration 13 makes it again, with the parent link of child runs
    "DROP TABLE run_children",
    "ALTER TABLE run_queue DROP COLUMN cancel_requested_at",
    "DROP TABLE schedules",
    "DROP TABLE run_inbox",
    "DROP TABLE run_event_waits",
    "DROP INDEX IF EXISTS run_queue_limit",
    "ALTER TABLE run_queue DROP COLUMN limit_max",
    "ALTER TABLE run_queue DROP COLUMN limit_key",
    "DELETE FROM schema_migrations WHERE version >= 9",
)


def _noop(ctx):  # type: ignore[no-untyped-def]
    return None


def _forget_migration_9(url: str, tmp_path: Path) -> None:
    if url.startswith("sqlite"):
        with sqlite3.connect(tmp_path / "tether.db") as connection:
            for statement in FORGET_0009:
                connection.execute(statement)
        return
    connection = pg.pg_reader(url)
    with connection.transaction():
        for statement in FORGET_0009:
            connection.execute(statement)


def test_upgrade_0009__carries_old_cancel_requests_over_and_keeps_every_run(
    store_url: str, tmp_path: Path
) -> None:
    flow = Workflow("flow", start="a", nodes=[compute("a", _noop)])
    with open_store(store_url) as store:
        client = Tether(store, workflows=[flow])
        held = client.start("flow", run_id="held").run_id
        plain = client.start("flow", run_id="plain").run_id
        assert store.claim(run_id=held, runner_id="host-old", claim_token="t-old", lease_ms=60_000)
        # How a cancel was requested before: a journal event for the holder to find.
        store.record_event(run_id=held, workflow_ref="workflow:flow", type="control.cancel_requested")
        latest = store.db.schema_version()[1]
    _forget_migration_9(store_url, tmp_path)

    with open_store(store_url) as store:
        assert store.db.schema_version() == (latest, latest)
        assert store.cancel_requests([held, plain]) == [held]
        assert {r.run_id for r in store.list_runs()} == {held, plain}
        assert store.live_workers() == []
        # The request is honoured: nothing more of the run begins under the old claim.
        with pytest.raises(CancelRequested):
            store.attempt_start(run_id=held, claim_token="t-old", node_id="a")
