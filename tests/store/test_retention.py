"""Retention: ``Store.prune`` deletes finished runs with everything recorded for them, on both
backends; restart families go children first; bad input is refused with nothing changed."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import pytest

from tether.errors import InvalidInput
from tether.store import RunRecord, Store

from .conftest import LEASE, at, rows, snapshot

Reserve = Callable[..., RunRecord]

#: Tables whose rows belong to runs; after every run is pruned they are empty.
RUN_TABLES = (
    "runs",
    "resources",
    "leases",
    "events",
    "run_queue",
    "run_sources",
    "run_bindings",
    "node_attempts",
    "attempt_active_intervals",
    "interactive_requests",
    "interactive_submissions",
    "human_decisions",
    "human_decision_resolutions",
    "effects",
    "effect_attempts",
    "workflow_messages",
    "viewer_runs",
    "viewer_revisions",
)


def count(store: Store, table: str) -> int:
    ((n,),) = rows(store, f"SELECT count(*) FROM {table}")
    return int(n)


def finish(store: Store, reserve: Reserve, run_id: str, how: str, at_ms: int, **overrides: Any) -> None:
    """A run that ends ``how`` (done, failed, cancelled) at ``at_ms``, after one node attempt."""
    reserve(run_id, origin_session_id=f"s-{run_id}", now=at(at_ms - 5), **overrides)
    if how == "cancelled":
        assert store.cancel(run_id=run_id, now=at(at_ms))
        return
    token = f"tok-{run_id}"
    assert store.claim(
        run_id=run_id, runner_id="host-a", claim_token=token, lease_ms=LEASE, now=at(at_ms - 4)
    )
    assert store.mark_running(run_id=run_id, claim_token=token, now=at(at_ms - 3))
    attempt = store.attempt_start(run_id=run_id, claim_token=token, node_id="a", now=at(at_ms - 2))
    store.attempt_finish(
        run_id=run_id,
        claim_token=token,
        attempt_id=attempt.attempt_id,
        status="completed",
        output={"run": run_id},
        now=at(at_ms - 1),
    )
    if how == "done":
        assert store.complete(run_id=run_id, claim_token=token, now=at(at_ms))
    else:
        assert store.fail(
            run_id=run_id,
            error_code="boom",
            error_message=f"{run_id} failed",
            claim_token=token,
            now=at(at_ms),
        )


def test_prune__removes_finished_runs_before_the_cut_off_with_everything_recorded(
    store: Store, reserve: Reserve
) -> None:
    finish(store, reserve, "old-done", "done", 100)
    finish(store, reserve, "old-failed", "failed", 200)
    finish(store, reserve, "old-cancelled", "cancelled", 300)
    finish(store, reserve, "new-done", "done", 5_000)
    reserve("queued", origin_session_id="s-queued", now=at(50))
    keep = {"new-done", "queued"}
    before = {r.run_id: r for r in store.list_runs()}
    report = store.prune(finished_before=at(1_000))
    assert sorted(report.run_ids) == ["old-cancelled", "old-done", "old-failed"]
    assert (report.runs, report.kept, report.attempts, report.dry_run) == (3, 0, 2, False)
    assert report.events >= 3 and report.blobs >= 1
    assert {r.run_id for r in store.list_runs()} == keep
    for run_id in keep:
        assert store.get_run(run_id) == before[run_id]
    assert rows(store, "SELECT DISTINCT run_id FROM node_attempts") == [("new-done",)]
    # Every blob left is one a row still refers to: the kept runs read theirs back whole.
    assert store.get_run("new-done") is not None and store.get_run_view("new-done") is not None
    assert [e.run_id for e in store.events_after(0, limit=1000) if e.run_id not in keep] == []
    # Nothing more to prune: a second call finds nothing.
    again = store.prune(finished_before=at(1_000))
    assert (again.runs, again.events, again.blobs) == (0, 0, 0)


def unreferenced(store: Store) -> set[bytes]:
    """The blobs no row refers to."""
    return {
        bytes(h)
        for (h,) in rows(
            store,
            "SELECT blob_hash FROM blobs WHERE blob_hash NOT IN ("
            " SELECT definition_hash FROM workflow_definitions"
            " UNION SELECT input_hash FROM runs UNION SELECT launch_options_hash FROM runs"
            " UNION SELECT error_hash FROM runs WHERE error_hash IS NOT NULL"
            " UNION SELECT error_hash FROM run_queue WHERE error_hash IS NOT NULL"
            " UNION SELECT payload_hash FROM events WHERE payload_hash IS NOT NULL"
            " UNION SELECT output_hash FROM node_attempts WHERE output_hash IS NOT NULL"
            " UNION SELECT error_hash FROM node_attempts WHERE error_hash IS NOT NULL"
            " UNION SELECT payload_hash FROM effects UNION SELECT payload_hash FROM workflow_messages)",
        )
    }


def test_prune__everything_gone_leaves_no_run_rows_and_no_unreferenced_blob(
    store: Store, reserve: Reserve
) -> None:
    for n, how in enumerate(("done", "failed", "cancelled", "done")):
        finish(store, reserve, f"run-{n}", how, 100 + n * 10)
    # (A cancel stores a rejection receipt that no row refers to when no submission waited:
    # such blobs are not the runs', prune_blobs sweeps them.)
    orphans = unreferenced(store)
    report = store.prune(finished_before=at(10_000))
    assert report.runs == 4
    assert {table: count(store, table) for table in RUN_TABLES} == dict.fromkeys(RUN_TABLES, 0)
    # The blobs left are the workflow definition's (definitions are shared and kept).
    assert unreferenced(store) == orphans
    assert count(store, "blobs") == count(store, "workflow_definitions") + len(orphans)


def test_prune__only_the_statuses_asked_for_and_at_most_limit(store: Store, reserve: Reserve) -> None:
    finish(store, reserve, "a-done", "done", 100)
    finish(store, reserve, "b-failed", "failed", 110)
    finish(store, reserve, "c-done", "done", 120)
    report = store.prune(finished_before=at(1_000), statuses=["failed"])
    assert report.run_ids == ["b-failed"]
    report = store.prune(finished_before=at(1_000), statuses=("done", "cancelled"), limit=1)
    assert report.run_ids == ["a-done"]  # oldest first
    assert {r.run_id for r in store.list_runs()} == {"c-done"}


def test_prune__dry_run_counts_and_changes_nothing(store: Store, reserve: Reserve) -> None:
    finish(store, reserve, "old", "done", 100)
    before = snapshot(store)
    report = store.prune(finished_before=at(1_000), dry_run=True)
    assert (report.runs, report.attempts, report.dry_run, report.run_ids) == (1, 1, True, ["old"])
    assert report.events > 0
    assert snapshot(store) == before


def test_prune__a_parent_stays_while_its_restart_child_stays_and_goes_with_it(
    store: Store, reserve: Reserve
) -> None:
    reserve("parent", origin_session_id="s-family", now=at(0))
    assert store.cancel(run_id="parent", now=at(10))
    ((revision,),) = rows(store, "SELECT revision FROM resources WHERE aggregate_key = 'parent'")
    reserve(
        "child",
        origin_session_id="s-family",
        parent_run_id="parent",
        lineage_kind="restart",
        parent_run_revision=revision,
        now=at(20),
    )
    # The child is still queued: the parent it points at stays.
    report = store.prune(finished_before=at(1_000))
    assert (report.runs, report.kept) == (0, 1)
    assert store.get_run("parent") is not None
    # The child finished, but after the cut-off: still both stay.
    assert store.cancel(run_id="child", now=at(2_000))
    report = store.prune(finished_before=at(1_000))
    assert (report.runs, report.kept) == (0, 1)
    # Both before the cut-off: they go together, the child first.
    report = store.prune(finished_before=at(3_000))
    assert report.run_ids == ["child", "parent"]
    assert store.list_runs() == []


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"finished_before": at(1), "statuses": ["done", "finished"]}, "unknown status 'finished'"),
        ({"finished_before": at(1), "statuses": []}, "no status given"),
        ({"finished_before": at(1), "statuses": "done"}, "statuses must be a list"),
        ({"finished_before": datetime(2026, 1, 1)}, "timezone-aware"),
        ({"finished_before": "2026-01-01"}, "finished_before must be a datetime"),
        ({"finished_before": at(1), "limit": 0}, "limit must be a whole number of at least 1"),
        ({"finished_before": at(1), "limit": True}, "limit must be a whole number"),
        ({"finished_before": at(1), "dry_run": "yes"}, "dry_run must be True or False"),
    ],
)
def test_prune__bad_input_is_refused_and_changes_nothing(
    store: Store, reserve: Reserve, arguments: dict[str, Any], message: str
) -> None:
    finish(store, reserve, "old", "done", 0)
    before = snapshot(store)
    with pytest.raises(InvalidInput, match=message):
        store.prune(**arguments)
    assert snapshot(store) == before


def test_prune__inside_a_transaction_is_refused(store: Store, reserve: Reserve) -> None:
    finish(store, reserve, "old", "done", 0)
    with pytest.raises(InvalidInput, match="outside a transaction"), store.transaction():
        store.prune(finished_before=at(1_000))
    assert store.get_run("old") is not None


def test_prune__a_project_store_prunes_only_its_project(
    store: Store, reserve: Reserve, open_at: Callable[..., Store]
) -> None:
    from .conftest import reserve_args

    finish(store, reserve, "mine", "done", 100)
    other = open_at("other")
    other.reserve(**reserve_args("theirs", origin_session_id="s-theirs", now=at(0)))
    assert other.cancel(run_id="theirs", now=at(100))
    assert store.prune(finished_before=at(1_000)).run_ids == ["mine"]
    assert other.get_run("theirs") is not None
    assert open_at(None).prune(finished_before=at(1_000)).run_ids == ["theirs"]
