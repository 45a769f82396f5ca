"""Readers of stored rows shared by the claim and move tests (the layout is the spec's, §2)."""

from __future__ import annotations

import json
from typing import Any

from tests.store.conftest import T0, row_dicts, rows
from tether.store import Store

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


def viewer_targets(store: Store, presentation_revision: int, run_id: str = "run-1") -> list[tuple[str, str]]:
    return [
        (r[0], r[1])
        for r in rows(
            store,
            "SELECT target_type, target_key FROM viewer_deltas "
            "WHERE run_id = ? AND presentation_revision = ? ORDER BY delta_index",
            run_id,
            presentation_revision,
        )
    ]


def events(store: Store, run_id: str = "run-1") -> list[dict[str, Any]]:
    found = rows(
        store,
        "SELECT e.resource_revision, e.event_type, e.actor_type, e.actor_id, e.lease_generation, b.content "
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
            "payload": None if r[5] is None else json.loads(bytes(r[5])),
        }
        for r in found
    ]


def text(store: Store, digest: bytes | None) -> str | None:
    if digest is None:
        return None
    found = rows(store, "SELECT CAST(content AS TEXT) FROM blobs WHERE blob_hash = ?", digest)
    return found[0][0] if found else None
