"""Migration 7: a populated store of schema version 6 (viewer deltas a row per target, patches and
journal payloads as blobs) is upgraded in place to one ``viewer_revisions`` row per stored
revision and journal entries that may hold their payload, and every read answers as before."""

from __future__ import annotations

from collections.abc import Callable

from tether.store import Store, ViewerTarget
from tether.store.db import migrations
from tether.store.records import RunRecord

from .conftest import at, rows
from .readers import apply_migration_7, to_version_6, viewer_deltas

OPS = ({"op": "append", "path": "/items", "value": {"n": 1, "text": "ü"}},)


def test_migration_7__upgrades_a_store_of_version_6_keeping_every_read(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed("run-1")
    store.viewer_record(
        run_id="run-1",
        targets=[ViewerTarget("timeline", "t1", OPS), ViewerTarget("graph", "", OPS), "summary"],
        now=at(5),
    )
    assert store.complete(run_id="run-1", claim_token="tok-run-1", now=at(6))
    claimed("run-2")
    with store.transaction():  # past the retention window: revisions before it are not readable
        for n in range(300):
            store.viewer_record(
                run_id="run-2", targets=[ViewerTarget("conversation", f"c{n % 3}")], now=at(10)
            )
    reads = {
        (run_id, revision): store.viewer_changes(run_id=run_id, revision=revision)
        for run_id in ("run-1", "run-2")
        for revision in range(0, 310)
    }
    views = store.list_run_views()
    feed = store.events_after(0, limit=1000)
    stored = viewer_deltas(store)
    current = store.viewer_changes(run_id="run-1", revision=1).revision

    to_version_6(store)
    assert rows(store, "SELECT count(*) FROM viewer_deltas") == [(len(stored),)]

    apply_migration_7(store)
    latest = migrations(store.db.backend)[-1][0]
    assert store.db.migrate() == latest
    assert store.db.schema_version() == (latest, latest)
    # One row per revision stored by version 6.
    assert rows(store, "SELECT count(*) FROM viewer_revisions WHERE run_id = 'run-1'") == [(current - 1,)]
    assert viewer_deltas(store) == stored
    for (run_id, revision), before in reads.items():
        assert store.viewer_changes(run_id=run_id, revision=revision) == before, (run_id, revision)
    assert store.list_run_views() == views
    # Journal entries stored before keep their payload blob and read as before.
    assert store.events_after(0, limit=1000) == feed
    assert rows(store, "SELECT count(*) FROM events WHERE payload IS NOT NULL") == [(0,)]

    # The upgraded store goes on recording after the migrated rows.
    assert store.viewer_record(run_id="run-1", targets=["summary"], now=at(20)) == current + 1
    changes = store.viewer_changes(run_id="run-1", revision=current - 1)
    assert [(d.presentation_revision, d.target_type) for d in changes.deltas] == [
        (current, "summary"),
        (current, "replay"),
        (current + 1, "summary"),
    ]
    recorded = [d for d in stored if d[0] == "run-1" and d[2] == "timeline"]
    assert [d[4][1:] for d in recorded] == [list(OPS)]
