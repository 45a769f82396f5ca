"""A scripted scenario through the store, printing the event journal as it grows."""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

from tether.store import Store, open_store
from tether.values import definition_digest


def _print_new(store: Store, seen: int) -> int:
    for event in store.events_after(seen, limit=1000):
        print(f"  #{event.seq:<3} {event.run_id:<12} {event.type:<24} {event.payload}")
        seen = event.seq
    return seen


def run_demo(path: Path | None = None) -> None:
    path = path or Path(tempfile.mkdtemp()) / "demo.db"
    store = open_store(f"sqlite:///{path}")
    snapshot = {"name": "greet", "nodes": ["hello"]}
    common: dict[str, Any] = {
        "workflow_name": "greet",
        "workflow_source_ref": "builtin:greet",
        "workflow_source": {"kind": "builtin", "id": "greet", "revision": "1"},
        "definition_digest": definition_digest(snapshot),
        "definition_snapshot": snapshot,
        "origin_session_id": "demo-session",
    }
    seen = 0
    print("reserve run-a, claim, mark running, park")
    store.reserve(run_id="run-a", input={"who": "world"}, **common)
    token = str(uuid.uuid4())
    store.claim_next(runner_id="host-demo", claim_token=token, lease_ms=30_000)
    store.mark_running(run_id="run-a", claim_token=token)
    store.park(run_id="run-a", claim_token=token)
    seen = _print_new(store, seen)
    print("resume run-a, claim it again, complete")
    token = str(uuid.uuid4())
    store.claim_next(runner_id="host-demo", claim_token=token, lease_ms=30_000)
    store.mark_running(run_id="run-a", claim_token=token)
    with store.transaction():
        store.set_run_status(run_id="run-a", claim_token=token, status="running")
        store.set_run_status(run_id="run-a", claim_token=token, status="completed")
        store.complete(run_id="run-a", claim_token=token)
    seen = _print_new(store, seen)
    print("restart run-a as run-b, then cancel it")
    parent = store.get_run_view("run-a")
    assert parent is not None
    revision = store.list_revision()
    store.reserve(
        run_id="run-b",
        input={"who": "again"},
        parent_run_id="run-a",
        lineage_kind="restart",
        parent_run_revision=len(store.events_after(0, run_id="run-a", limit=1000)),
        **common,
    )
    store.cancel(run_id="run-b")
    seen = _print_new(store, seen)
    print(f"list revision before restart: {revision.revision}; after: {store.list_revision().revision}")
    for view in store.list_run_views(limit=10).runs:
        print(
            f"  {view.run_id}: queue={view.status} run={view.run_state_status} restart#{view.restart_number}"
        )
    store.close()
