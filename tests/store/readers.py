"""Readers of stored rows shared by the claim and move tests (the layout is the spec's, §2)."""

from __future__ import annotations

import json
from typing import Any

from tests.store.conftest import T0, execute, row_dicts, rows
from tether.store import Store
from tether.store.db import migrations, sql_statements
from tether.store.journal import stored_viewer_deltas
from tether.values import canonical_bytes, sha256

T0_MS = int(T0.timestamp() * 1000)


def ms(offset: int) -> int:
    """The stored epoch milliseconds of ``at(offset)``."""
    return T0_MS + offset


def one(store: Store, sql: str, *params: Any) -> dict[str, Any]:
    found = row_dicts(store, sql, *params)
    assert len(found) == 1, found
    return found[0]


def queue_row(store: Store, run_id: str = "run-1") -> dict[str, Any]:
    return one(store, "SELECT * FROM run_queue WHERE run_id = ?", run_id)


def run_row(store: Store, run_id: str = "run-1") -> dict[str, Any]:
    return one(store, "SELECT * FROM runs WHERE run_id = ?", run_id)


def lease_row(store: Store, run_id: str = "run-1") -> dict[str, Any]:
    return one(
        store,
        "SELECT l.* FROM leases l JOIN runs r ON r.resource_id = l.resource_id WHERE r.run_id = ?",
        run_id,
    )


def revision(store: Store, run_id: str = "run-1") -> int:
    return int(
        one(
            store,
            "SELECT s.revision FROM resources s JOIN runs r ON r.resource_id = s.resource_id "
            "WHERE r.run_id = ?",
            run_id,
        )["revision"]
    )


def viewer_deltas(store: Store, run_id: str | None = None) -> list[tuple[str, int, str, str, Any]]:
    """Every stored viewer delta as (run id, presentation revision, target type, target key, patch),
    decoded from the ``viewer_revisions`` rows in revision order."""
    where = "" if run_id is None else " WHERE run_id = ?"
    found = rows(
        store,
        "SELECT run_id, first_revision, changes FROM viewer_revisions"
        + where
        + " ORDER BY run_id, last_revision",
        *(() if run_id is None else (run_id,)),
    )
    return [
        (run, d.presentation_revision, d.target_type, d.target_key, d.patch)
        for run, first, changes in found
        for d in stored_viewer_deltas(int(first), changes)
    ]


def viewer_targets(store: Store, presentation_revision: int, run_id: str = "run-1") -> list[tuple[str, str]]:
    return [(d[2], d[3]) for d in viewer_deltas(store, run_id) if d[1] == presentation_revision]


def events(store: Store, run_id: str = "run-1") -> list[dict[str, Any]]:
    found = rows(
        store,
        "SELECT e.resource_revision, e.event_type, e.actor_type, e.actor_id, e.lease_generation, "
        "COALESCE(e.payload, CAST(b.content AS TEXT)) "
        "FROM events e JOIN runs r ON r.resource_id = e.resource_id "
        "LEFT JOIN blobs b ON b.blob_hash = e.payload_hash WHERE r.run_id = ? ORDER BY e.event_seq",
        run_id,
    )
    return [
        {
            "revision": r[0],
            "type": r[1],
            "actor_type": r[2],
            "actor_id": r[3],
            "generation": r[4],
            "payload": None if r[5] is None else json.loads(r[5]),
        }
        for r in found
    ]


def text(store: Store, digest: bytes | None) -> str | None:
    if digest is None:
        return None
    found = rows(store, "SELECT CAST(content AS TEXT) FROM blobs WHERE blob_hash = ?", digest)
    return found[0][0] if found else None


#: ``viewer_deltas`` as schema version 6 defined it (migrations 0001 and 0005), per backend.
_VIEWER_DELTAS_V6 = {
    "sqlite": """CREATE TABLE viewer_deltas (
  run_id TEXT NOT NULL REFERENCES viewer_runs(run_id) ON DELETE CASCADE,
  presentation_revision INTEGER NOT NULL,
  delta_index INTEGER NOT NULL,
  target_type TEXT NOT NULL CHECK (
    (target_type = 'summary' OR target_type = 'graph' OR target_type = 'replay'
        OR target_type = 'timeline' OR target_type = 'conversation' OR target_type = 'inspector')),
  target_key TEXT NOT NULL DEFAULT '',
  patch_hash BLOB NOT NULL REFERENCES blobs(blob_hash),
  recorded_at INTEGER NOT NULL,
  PRIMARY KEY (run_id, presentation_revision, delta_index)
) STRICT""",
    "postgres": """CREATE TABLE viewer_deltas (
  run_id TEXT NOT NULL REFERENCES viewer_runs(run_id) ON DELETE CASCADE,
  presentation_revision BIGINT NOT NULL,
  delta_index BIGINT NOT NULL,
  target_type TEXT NOT NULL CHECK (
    target_type IN ('summary', 'graph', 'replay', 'timeline', 'conversation', 'inspector')),
  target_key TEXT NOT NULL DEFAULT '',
  patch_hash BYTEA NOT NULL REFERENCES blobs(blob_hash),
  recorded_at BIGINT NOT NULL,
  PRIMARY KEY (run_id, presentation_revision, delta_index)
)""",
}


def to_version_6(store: Store) -> None:
    """Write the store back in schema version 6's layout, as that version wrote it: viewer
    revisions as a row per target of each revision, its patch a JSON blob, and every journal
    entry's payload a blob; drop what version 7 added and forget migration 7 (only 7: the later
    migrations change other tables): a store of version 6's layout for migration 7 to upgrade."""
    found = rows(store, "SELECT run_id, first_revision, changes, recorded_at FROM viewer_revisions")
    execute(store, _VIEWER_DELTAS_V6[store.db.backend])
    for run_id, first, changes, recorded_at in found:
        index = 0
        last = None
        for delta in stored_viewer_deltas(int(first), changes):
            index = 0 if delta.presentation_revision != last else index + 1
            last = delta.presentation_revision
            content = canonical_bytes(delta.patch)
            execute(
                store,
                "INSERT INTO blobs(blob_hash, media_type, byte_length, content, created_at)"
                " VALUES (?, 'application/json', ?, ?, ?) ON CONFLICT DO NOTHING",
                sha256(content),
                len(content),
                content,
                recorded_at,
            )
            execute(
                store,
                "INSERT INTO viewer_deltas VALUES (?, ?, ?, ?, ?, ?, ?)",
                run_id,
                delta.presentation_revision,
                index,
                delta.target_type,
                delta.target_key,
                sha256(content),
                recorded_at,
            )
    execute(store, "DROP TABLE viewer_revisions")
    for seq, payload, recorded_at in rows(
        store, "SELECT event_seq, payload, recorded_at FROM events WHERE payload IS NOT NULL"
    ):
        content = payload.encode()
        execute(
            store,
            "INSERT INTO blobs(blob_hash, media_type, byte_length, content, created_at)"
            " VALUES (?, 'application/json', ?, ?, ?) ON CONFLICT DO NOTHING",
            sha256(content),
            len(content),
            content,
            recorded_at,
        )
        execute(
            store,
            "UPDATE events SET payload = NULL, payload_hash = ? WHERE event_seq = ?",
            sha256(content),
            seq,
        )
    execute(store, "ALTER TABLE events DROP COLUMN payload")
    execute(store, "DELETE FROM schema_migrations WHERE version = 7")


def apply_migration_7(store: Store) -> None:
    """Apply migration 7 alone, as the migration runner does (later migrations stay applied)."""
    for statement in sql_statements(dict(migrations(store.db.backend))[7]):
        execute(store, statement)
    execute(store, "INSERT INTO schema_migrations(version, applied_at) VALUES (7, 0)")
