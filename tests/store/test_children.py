"""Child runs in the store: the start under the parent's claim, the link both ways, the parent's
wake-up in the child's finishing move, and the cancel that reaches the children a parent waits
for."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tether.errors import ClaimLost, Conflict
from tether.store import RunRecord, Store

from .conftest import LEASE, at, reserve_args, snapshot


def start_child(store: Store, parent: str = "run-1", child: str = "run-1.spawn", **overrides: Any) -> str:
    args = reserve_args(child, origin_session_id="session-1", execution_mode="headless")
    args = {k: v for k, v in args.items() if k not in ("run_id", "now")}
    params: dict[str, Any] = {
        "parent_run_id": parent,
        "claim_token": f"tok-{parent}",
        "node_id": "spawn",
        "child_run_id": child,
        "waits": True,
        **args,
        "now": at(10),
        **overrides,
    }
    return store.child_start(**params).state


@pytest.fixture
def parent(store: Store, claimed: Callable[..., RunRecord]) -> str:
    """A headless run held as ``host-a`` whose durable status is running, its node begun."""
    claimed("run-1", execution_mode="headless")
    store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="running", now=at(1))
    store.attempt_start(run_id="run-1", claim_token="tok-run-1", node_id="spawn", now=at(2))
    return "run-1"


def statuses(store: Store, run_id: str) -> tuple[str, str]:
    view = store.get_run_view(run_id)
    assert view is not None
    return view.status, view.run_state_status


def finish_child(store: Store, child: str = "run-1.spawn", now: int = 100) -> None:
    assert store.claim(run_id=child, runner_id="host-b", claim_token="tok-kid", lease_ms=LEASE, now=at(now))
    store.set_run_status(run_id=child, claim_token="tok-kid", status="running", now=at(now))
    assert store.complete(run_id=child, claim_token="tok-kid", now=at(now + 1))


def test_child_start__parks_the_parent_waiting_and_links_both_ways(store: Store, parent: str) -> None:
    assert start_child(store) == "reserved"
    assert statuses(store, parent) == ("parked", "waiting")
    assert statuses(store, "run-1.spawn") == ("queued", "queued")
    assert store.get_run(parent).runner_id is None  # type: ignore[union-attr]
    (kid,) = store.children(parent)
    assert (kid.run_id, kid.node_id, kid.waits, kid.workflow_name, kid.status) == (
        "run-1.spawn",
        "spawn",
        True,
        "demo",
        "queued",
    )
    link = store.parent_of("run-1.spawn")
    assert link is not None and (link.parent_run_id, link.node_id, link.waits) == (parent, "spawn", True)
    assert store.parent_of(parent) is None
    assert [a.status for a in store.attempts(parent)] == ["waiting"]
    (started,) = store.events_after(0, run_id=parent, event_type="run.child_started")
    assert started.payload == {"childRunId": "run-1.spawn", "nodeId": "spawn", "waits": True}
    assert started.runner_id == "host-a"


def test_child_finishing__requeues_the_waiting_parent_in_the_same_move(store: Store, parent: str) -> None:
    start_child(store)
    assert store.claim_next(runner_id="host-c", claim_token="tok-c", lease_ms=LEASE, now=at(50)).run_id == (  # type: ignore[union-attr]
        "run-1.spawn"
    )
    store.set_run_status(run_id="run-1.spawn", claim_token="tok-c", status="running", now=at(50))
    assert statuses(store, parent) == ("parked", "waiting")
    assert store.complete(run_id="run-1.spawn", claim_token="tok-c", now=at(60))
    assert statuses(store, parent) == ("queued", "waiting")
    woken = store.events_after(0, run_id=parent, event_type="run.child_finished")
    assert [e.payload for e in woken] == [{"childRunId": "run-1.spawn", "nodeId": "spawn", "status": "done"}]
    assert (
        store.claim_next(runner_id="host-c", claim_token="tok-d", lease_ms=LEASE, now=at(70)).run_id == parent
    )  # type: ignore[union-attr]


def test_child_failing__requeues_the_waiting_parent_too(store: Store, parent: str) -> None:
    start_child(store)
    assert store.claim(
        run_id="run-1.spawn", runner_id="host-b", claim_token="tok-kid", lease_ms=LEASE, now=at(50)
    )
    assert store.fail(
        run_id="run-1.spawn", claim_token="tok-kid", error_code="nodeFailed", error_message="no", now=at(60)
    )
    assert statuses(store, parent) == ("queued", "waiting")


def test_child_start__a_second_start_adopts_and_a_foreign_run_id_is_refused(
    store: Store, parent: str, reserve: Callable[..., RunRecord]
) -> None:
    start_child(store, waits=False)
    assert start_child(store, waits=False) == "adopted"
    assert [c.run_id for c in store.children(parent)] == ["run-1.spawn"]
    with pytest.raises(Conflict, match="child of node spawn of run-1, not of node other"):
        start_child(store, node_id="other", waits=False)
    reserve("someone-else", origin_session_id="session-2")
    before = snapshot(store)
    with pytest.raises(Conflict, match="not a child of run-1"):
        start_child(store, child="someone-else", waits=False)
    assert snapshot(store) == before


def test_child_start__under_a_lost_claim_writes_nothing(store: Store, parent: str) -> None:
    before = snapshot(store)
    with pytest.raises(ClaimLost):
        start_child(store, claim_token="tok-stale")
    assert snapshot(store) == before


def test_child_wait__parks_again_for_an_unfinished_child_and_not_for_a_finished_one(
    store: Store, parent: str
) -> None:
    start_child(store)
    # An operator's resume puts the parent in the queue before its child finished.
    assert store.request_resume(run_id=parent, now=at(20))
    assert store.claim(run_id=parent, runner_id="host-a", claim_token="tok-2", lease_ms=LEASE, now=at(21))
    assert store.child_wait(parent_run_id=parent, claim_token="tok-2", child_run_id="run-1.spawn", now=at(22))
    assert statuses(store, parent) == ("parked", "waiting")
    finish_child(store)
    assert store.claim(run_id=parent, runner_id="host-a", claim_token="tok-3", lease_ms=LEASE, now=at(200))
    assert not store.child_wait(
        parent_run_id=parent, claim_token="tok-3", child_run_id="run-1.spawn", now=at(201)
    )


def test_request_cancel__cancels_the_children_the_parent_waits_for(store: Store, parent: str) -> None:
    start_child(store)
    assert store.request_cancel(run_id=parent, now=at(30)) == "cancelled"
    assert statuses(store, parent) == ("cancelled", "cancelled")
    assert statuses(store, "run-1.spawn") == ("cancelled", "cancelled")


def test_request_cancel__leaves_a_detached_child_running(store: Store, parent: str) -> None:
    start_child(store, waits=False)
    assert store.request_cancel(run_id=parent, now=at(30)) == "requested"  # the parent is held
    assert statuses(store, "run-1.spawn") == ("queued", "queued")


def test_request_cancel__of_a_finished_parent_writes_nothing(store: Store, parent: str) -> None:
    start_child(store, waits=False)
    assert store.complete(run_id=parent, claim_token="tok-run-1", now=at(30))
    before = snapshot(store)
    with pytest.raises(Conflict, match="already done"):
        store.request_cancel(run_id=parent, now=at(40))
    assert snapshot(store) == before
