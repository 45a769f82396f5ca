"""The per-run viewer projection: revision counts per operation, patches, retention and cursors.

SPEC §3.2 (viewer revisions in brackets), §5, §9 invariant 11, §11 items 76-77.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tether.errors import InvalidInput, NotFound, TetherError
from tether.store import RunRecord, Store, ViewerChanges, ViewerDelta, ViewerTarget

from .conftest import LEASE, at, execute, reserve_args, rows, snapshot
from .readers import viewer_deltas

TOKEN = "tok-run-1"
BUMP = [("summary", ""), ("graph", ""), ("replay", ""), ("inspector", "run")]
STATUS = [("summary", ""), ("replay", "")]


def current(store: Store, run_id: str = "run-1") -> tuple[int, int]:
    """(presentation_revision, retained_from_revision) of the run's projection."""
    (row,) = rows(
        store,
        "SELECT presentation_revision, retained_from_revision FROM viewer_runs WHERE run_id = ?",
        run_id,
    )
    return int(row[0]), int(row[1])


def targets_by_revision(store: Store, after: int, run_id: str = "run-1") -> list[list[tuple[str, str]]]:
    grouped: dict[int, list[tuple[str, str]]] = {}
    for _, revision, target_type, target_key, _ in viewer_deltas(store, run_id):
        if revision > after:
            grouped.setdefault(revision, []).append((target_type, target_key))
    assert list(grouped) == list(range(after + 1, after + 1 + len(grouped)))
    return list(grouped.values())


def patches_at(store: Store, revision: int, run_id: str = "run-1") -> dict[tuple[str, str], Any]:
    return {(t, k): p for _, r, t, k, p in viewer_deltas(store, run_id) if r == revision}


def header(revision: int) -> dict[str, Any]:
    return {"op": "replace", "path": "/presentationRevision", "value": revision}


# -- revision counts per operation -------------------------------------------------------------


def test_viewer__reserve_starts_the_projection_at_revision_one(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    assert current(store) == (1, 1)
    assert rows(store, "SELECT count(*) FROM viewer_revisions") == [(0,)]


def expired_interaction(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(1))
    attempt = store.attempt_start(
        run_id="run-1", claim_token=TOKEN, node_id="model", timeout_ms=10, now=at(2)
    ).attempt_id
    number = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(2))
    store.interval_sample(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt,
        interval_number=number,
        elapsed_ms=10,
        now=at(12),
    )
    with store.transaction():
        store.request_open(
            run_id="run-1", claim_token=TOKEN, attempt_id=attempt, kind="ask", payload={}, now=at(13)
        )
        assert store.park(run_id="run-1", claim_token=TOKEN, now=at(13))
    assert store.claim_for_control(
        run_id="run-1", runner_id="host-a", claim_token="tok-c", lease_ms=LEASE, now=at(14)
    )


SETUPS: dict[str, Callable[[Store, Callable[..., RunRecord]], object]] = {
    "reserved": lambda store, claimed: store.reserve(**reserve_args()),
    "claimed": lambda store, claimed: claimed(running=False),
    "running": lambda store, claimed: claimed(),
    "parked": lambda store, claimed: (claimed(), store.park(run_id="run-1", claim_token=TOKEN, now=at(5))),
    "expired_interaction": expired_interaction,
    "pending_effect": lambda store, claimed: (
        claimed(),
        store.effect_enqueue(
            run_id="run-1", claim_token=TOKEN, effect_type="run.park_queue", idempotency_key="k", now=at(5)
        ),
    ),
}

OPERATIONS: list[tuple[str, str, Callable[[Store], object], list[list[tuple[str, str]]]]] = [
    (
        "claim",
        "reserved",
        lambda s: s.claim(run_id="run-1", runner_id="host-a", claim_token=TOKEN, lease_ms=LEASE, now=at(10)),
        [BUMP],
    ),
    (
        "claim_next",
        "reserved",
        lambda s: s.claim_next(runner_id="host-a", claim_token=TOKEN, lease_ms=LEASE, now=at(10)),
        [BUMP],
    ),
    (
        "claim_for_control",
        "parked",
        lambda s: s.claim_for_control(
            run_id="run-1", runner_id="host-a", claim_token="c", lease_ms=LEASE, now=at(10)
        ),
        [BUMP],
    ),
    (
        "mark_running",
        "claimed",
        lambda s: s.mark_running(run_id="run-1", claim_token=TOKEN, now=at(10)),
        [BUMP],
    ),
    (
        "renew",
        "running",
        lambda s: s.renew(run_id="run-1", claim_token=TOKEN, lease_ms=LEASE, now=at(10)),
        [],  # a renewal writes the lease row only (docs/seed-departures.md)
    ),
    ("park", "running", lambda s: s.park(run_id="run-1", claim_token=TOKEN, now=at(10)), [BUMP, STATUS]),
    (
        "complete",
        "running",
        lambda s: s.complete(run_id="run-1", claim_token=TOKEN, now=at(10)),
        [BUMP, STATUS],
    ),
    (
        "fail",
        "running",
        lambda s: s.fail(run_id="run-1", claim_token=TOKEN, error_code="e", error_message="x", now=at(10)),
        [BUMP, STATUS],
    ),
    (
        "fail_tokenless",
        "reserved",
        lambda s: s.fail(run_id="run-1", error_code="e", error_message="x", now=at(10)),
        [BUMP, STATUS],
    ),
    ("cancel", "running", lambda s: s.cancel(run_id="run-1", claim_token=TOKEN, now=at(10)), [BUMP, STATUS]),
    ("cancel_tokenless", "reserved", lambda s: s.cancel(run_id="run-1", now=at(10)), [BUMP, STATUS]),
    ("cancel_stale", "parked", lambda s: s.cancel_stale(run_id="run-1", now=at(10)), [BUMP, STATUS]),
    (
        "interaction_timeout",
        "expired_interaction",
        lambda s: s.begin_interaction_timeout(
            run_id="run-1", target_session_id="session-1", claim_token="tok-c", now=at(20)
        ),
        [BUMP, [("summary", ""), ("replay", ""), ("conversation", "")]],
    ),
    (
        "record_event",
        "reserved",
        lambda s: s.record_event(run_id="run-1", workflow_ref="x", type="t", now=at(10)),
        [BUMP],
    ),
    (
        "park_for_no_progress",
        "running",
        lambda s: s.park_for_no_progress(run_id="run-1", claim_token=TOKEN, detail="d", now=at(10)),
        [BUMP, STATUS],
    ),
    ("request_resume", "parked", lambda s: s.request_resume(run_id="run-1", now=at(10)), [BUMP, STATUS]),
    (
        "settle_effects",
        "pending_effect",
        lambda s: s.settle_effects("run-1", "run.park_queue", now=at(10)),
        [],
    ),
]


@pytest.mark.parametrize(
    ("setup", "operation", "expected"),
    [pytest.param(setup, op, expected, id=name) for name, setup, op, expected in OPERATIONS],
)
def test_viewer__each_operation_records_its_revisions(
    store: Store,
    claimed: Callable[..., RunRecord],
    setup: str,
    operation: Callable[[Store], object],
    expected: list[list[tuple[str, str]]],
) -> None:
    SETUPS[setup](store, claimed)
    before, _ = current(store)
    assert operation(store)
    after, _ = current(store)
    assert after == before + len(expected)
    assert targets_by_revision(store, before) == expected


@pytest.mark.parametrize(
    "operation",
    [
        lambda s: s.renew(run_id="run-1", claim_token="wrong", lease_ms=LEASE, now=at(10)),
        lambda s: s.park(run_id="run-1", claim_token="wrong", now=at(10)),
        lambda s: s.fail(run_id="run-1", claim_token="wrong", error_code="e", error_message="x", now=at(10)),
        lambda s: s.cancel(run_id="run-1", claim_token="wrong", now=at(10)),
        lambda s: s.cancel(run_id="run-1", now=at(10)),
        lambda s: s.claim(run_id="run-1", runner_id="host-b", claim_token="b", lease_ms=LEASE, now=at(10)),
    ],
    ids=["renew", "park", "fail", "cancel", "cancel_tokenless", "claim"],
)
def test_viewer__a_refused_operation_records_no_revision(
    store: Store, claimed: Callable[..., RunRecord], operation: Callable[[Store], object]
) -> None:
    claimed()
    before = snapshot(store)
    assert not operation(store)
    assert snapshot(store) == before


def test_viewer__a_lifecycle_keeps_revisions_contiguous(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()  # reserve 1, claim 2, mark_running 3
    assert store.renew(run_id="run-1", claim_token=TOKEN, lease_ms=LEASE, now=at(1))  # none
    store.record_event(run_id="run-1", workflow_ref="x", type="t", now=at(2))  # 4
    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(3))  # 5, 6
    assert store.claim(run_id="run-1", runner_id="host-b", claim_token="b", lease_ms=LEASE, now=at(4))  # 7
    assert store.cancel(run_id="run-1", claim_token="b", now=at(5))  # 8, 9
    assert current(store) == (9, 1)
    assert targets_by_revision(store, 1) == [BUMP, BUMP, BUMP, BUMP, STATUS, BUMP, BUMP, STATUS]


# -- patches -----------------------------------------------------------------------------------


def test_viewer__every_patch_starts_with_the_presentation_revision_and_graph_adds_its_own(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed(running=False)
    revision, _ = current(store)
    assert patches_at(store, revision) == {
        ("summary", ""): [header(revision)],
        ("graph", ""): [header(revision), {"op": "replace", "path": "/graphRevision", "value": revision}],
        ("replay", ""): [header(revision)],
        ("inspector", "run"): [header(revision)],
    }


def test_viewer_record__appends_the_callers_operations_after_the_header(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    ops = ({"op": "append", "path": "/items", "value": {"n": 1}}, {"op": "remove", "path": "/stale"})
    revision = store.viewer_record(
        run_id="run-1",
        targets=[ViewerTarget("timeline", "node-a", ops), "graph", ViewerTarget("conversation")],
        now=at(5),
    )
    assert revision == 2 and current(store) == (2, 1)
    assert patches_at(store, 2) == {
        ("timeline", "node-a"): [header(2), *ops],
        ("graph", ""): [header(2), {"op": "replace", "path": "/graphRevision", "value": 2}],
        ("conversation", ""): [header(2)],
    }
    changes = store.viewer_changes(run_id="run-1", revision=1)
    assert changes.deltas[0] == ViewerDelta(2, "timeline", "node-a", [header(2), *ops])


def test_viewer_record__needs_at_least_one_target(store: Store, reserve: Callable[..., RunRecord]) -> None:
    reserve()
    before = snapshot(store)
    with pytest.raises(TetherError, match=r"^Viewer change must name at least one bounded target$"):
        store.viewer_record(run_id="run-1", targets=[], now=at(5))
    assert snapshot(store) == before


def test_viewer_record__unknown_run_raises(store: Store, reserve: Callable[..., RunRecord]) -> None:
    reserve()
    before = snapshot(store)
    with pytest.raises(NotFound, match=r"^Viewer projection does not exist for workflow run: run-404$"):
        store.viewer_record(run_id="run-404", targets=["summary"], now=at(5))
    assert snapshot(store) == before


@pytest.mark.parametrize(
    "target",
    [
        "chart",
        ViewerTarget("summary", "", ({"op": "move", "path": "/a"},)),
        ViewerTarget("summary", "", ({"op": "add"},)),
    ],
    ids=["unknown-type", "unknown-op", "no-path"],
)
def test_viewer_record__refuses_invalid_targets(
    store: Store, reserve: Callable[..., RunRecord], target: ViewerTarget | str
) -> None:
    reserve()
    before = snapshot(store)
    with pytest.raises(InvalidInput):
        store.viewer_record(run_id="run-1", targets=[target], now=at(5))
    assert snapshot(store) == before


# -- retention ---------------------------------------------------------------------------------


def test_viewer__keeps_the_last_256_revisions(store: Store, reserve: Callable[..., RunRecord]) -> None:
    reserve()
    with store.transaction():
        for n in range(300):
            store.viewer_record(run_id="run-1", targets=["summary", "graph"], now=at(n))
    assert current(store) == (301, 46)
    # The revisions of one transaction are one row, kept while any of them is in the window.
    assert rows(store, "SELECT first_revision, last_revision FROM viewer_revisions") == [(2, 301)]
    changes = store.viewer_changes(run_id="run-1", revision=45)
    assert sorted({d.presentation_revision for d in changes.deltas}) == list(range(46, 302))
    assert len(changes.deltas) == 256 * 2


def test_viewer__retention_window_slides_one_revision_at_a_time(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    with store.transaction():
        for n in range(255):
            store.viewer_record(run_id="run-1", targets=["summary"], now=at(n))
    assert current(store) == (256, 1)
    store.viewer_record(run_id="run-1", targets=["summary"], now=at(300))
    assert current(store) == (257, 2)
    store.viewer_record(run_id="run-1", targets=["summary"], now=at(301))
    assert current(store) == (258, 3)
    assert rows(
        store, "SELECT first_revision, last_revision FROM viewer_revisions ORDER BY last_revision"
    ) == [
        (2, 256),
        (257, 257),
        (258, 258),
    ]
    with store.transaction():
        for n in range(256):
            store.viewer_record(run_id="run-1", targets=["summary"], now=at(400 + n))
    assert current(store) == (514, 259)
    # The rows wholly before the window are gone.
    assert rows(store, "SELECT first_revision, last_revision FROM viewer_revisions") == [(259, 514)]


# -- cursors -----------------------------------------------------------------------------------


def with_revisions(store: Store, reserve: Callable[..., RunRecord], count: int) -> None:
    reserve()
    with store.transaction():
        for n in range(count):
            store.viewer_record(
                run_id="run-1",
                targets=[ViewerTarget("summary"), ViewerTarget("timeline", f"t{n % 2}")],
                now=at(n),
            )


@pytest.mark.parametrize("revision", [0, -1, 6, 100])
def test_viewer_changes__snapshot_required_outside_the_known_range(
    store: Store, reserve: Callable[..., RunRecord], revision: int
) -> None:
    with_revisions(store, reserve, 4)  # revisions 1..5
    assert store.viewer_changes(run_id="run-1", revision=revision) == ViewerChanges("run-1", 5, True, [], [])


def test_viewer_changes__deltas_in_order_with_targets_to_refetch(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    with_revisions(store, reserve, 4)  # revision 2 names t0, 3 t1, 4 t0, 5 t1
    changes = store.viewer_changes(run_id="run-1", revision=2)
    assert (changes.run_id, changes.revision, changes.snapshot_required) == ("run-1", 5, False)
    assert [(d.presentation_revision, d.target_type, d.target_key) for d in changes.deltas] == [
        (3, "summary", ""),
        (3, "timeline", "t1"),
        (4, "summary", ""),
        (4, "timeline", "t0"),
        (5, "summary", ""),
        (5, "timeline", "t1"),
    ]
    assert all(d.patch == [header(d.presentation_revision)] for d in changes.deltas)
    assert changes.targets == [("summary", ""), ("timeline", "t1"), ("timeline", "t0")]


def test_viewer_changes__from_the_first_revision(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()  # revisions 1..3
    changes = store.viewer_changes(run_id="run-1", revision=1)
    assert not changes.snapshot_required
    assert [d.presentation_revision for d in changes.deltas] == [2, 2, 2, 2, 3, 3, 3, 3]
    assert changes.targets == BUMP


def test_viewer_changes__at_the_current_revision_is_empty(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    assert store.viewer_changes(run_id="run-1", revision=3) == ViewerChanges("run-1", 3, False, [], [])


def test_viewer_changes__bridges_from_just_before_the_retained_window(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    with_revisions(store, reserve, 300)  # revisions 1..301, retained from 46
    assert current(store) == (301, 46)
    bridged = store.viewer_changes(run_id="run-1", revision=45)
    assert not bridged.snapshot_required
    assert bridged.deltas[0].presentation_revision == 46
    assert bridged.deltas[-1].presentation_revision == 301
    assert len(bridged.deltas) == 256 * 2
    assert store.viewer_changes(run_id="run-1", revision=44) == ViewerChanges("run-1", 301, True, [], [])
    assert store.viewer_changes(run_id="run-1", revision=1).snapshot_required


def test_viewer_changes__a_gap_in_the_deltas_requires_a_snapshot(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    for n in range(4):  # one transaction, and so one stored row, per revision
        store.viewer_record(
            run_id="run-1",
            targets=[ViewerTarget("summary"), ViewerTarget("timeline", f"t{n % 2}")],
            now=at(n),
        )
    execute(store, "DELETE FROM viewer_revisions WHERE last_revision = 4")
    assert store.viewer_changes(run_id="run-1", revision=2).snapshot_required
    assert store.viewer_changes(run_id="run-1", revision=3).snapshot_required
    after_gap = store.viewer_changes(run_id="run-1", revision=4)
    assert not after_gap.snapshot_required
    assert {d.presentation_revision for d in after_gap.deltas} == {5}


def test_viewer_changes__unknown_run_and_invalid_revision(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    with pytest.raises(NotFound, match=r"^Viewer projection does not exist for workflow run: run-404$"):
        store.viewer_changes(run_id="run-404", revision=1)
    for revision in (1.0, "1", True):
        with pytest.raises(InvalidInput):
            store.viewer_changes(run_id="run-1", revision=revision)  # type: ignore[arg-type]


# -- viewer writes held back to the commit (Database.defer) ---------------------------------------
def test_viewer__revisions_recorded_in_one_transaction_are_read_back_inside_it(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    with store.transaction():
        for n in range(3):
            assert store.viewer_record(run_id="run-1", targets=["summary", "graph"], now=at(n)) == n + 2
        inside = store.viewer_changes(run_id="run-1", revision=1)
        assert [d.presentation_revision for d in inside.deltas] == [2, 2, 3, 3, 4, 4]
        # Recorded after that read, still counted from the row it advanced.
        assert store.viewer_record(run_id="run-1", targets=["replay"], now=at(9)) == 5
    assert current(store) == (5, 1)
    assert targets_by_revision(store, 1) == [[("summary", ""), ("graph", "")]] * 3 + [[("replay", "")]]
    assert store.viewer_changes(run_id="run-1", revision=4).deltas == [
        ViewerDelta(5, "replay", "", [header(5)])
    ]


def test_viewer__revisions_of_a_run_deleted_in_the_same_transaction_go_with_it(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    with store.transaction():
        store.viewer_record(run_id="run-1", targets=["summary"], now=at(1))
        store.viewer_record(run_id="run-1", targets=["graph"], now=at(2))
        assert store.delete(run_id="run-1", claim_token="tok-run-1", now=at(3))
    assert store.get_run("run-1") is None
    assert rows(store, "SELECT count(*) FROM viewer_runs") == [(0,)]
    assert rows(store, "SELECT count(*) FROM viewer_revisions") == [(0,)]


def test_viewer__revisions_of_a_transaction_that_fails_are_not_written(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    before = snapshot(store)
    with pytest.raises(NotFound), store.transaction():
        store.viewer_record(run_id="run-1", targets=["summary"], now=at(1))
        store.viewer_record(run_id="run-1", targets=["graph"], now=at(2))
        store.viewer_record(run_id="run-404", targets=["graph"], now=at(3))
    assert snapshot(store) == before


def test_deferred_writes__go_out_before_a_statement_on_their_tables_or_a_delete_or_the_commit(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    sent: list[str] = []
    with store.transaction():
        store.db.defer("probe", frozenset({"viewer_runs"}), lambda: sent.append("first"))
        store.db.defer("probe", frozenset({"viewer_runs"}), lambda: sent.append("again"))
        store.db.one("run_row", run_id="run-1")
        assert sent == []  # a statement that does not name the table leaves them held
        store.db.one("viewer_get", run_id="run-1")
        assert sent == ["first"]  # once, before it: a key held back already keeps its place
        store.db.defer("probe", frozenset({"viewer_runs"}), lambda: sent.append("delete"))
        store.db.run("run_delete_events", resource_id="no-such-resource")
        assert sent == ["first", "delete"]  # a delete may cascade into any table
        store.db.defer("probe", frozenset({"viewer_runs"}), lambda: sent.append("commit"))
        assert sent == ["first", "delete"]
    assert sent == ["first", "delete", "commit"]
    with pytest.raises(RuntimeError), store.transaction():
        store.db.defer("probe", frozenset({"viewer_runs"}), lambda: sent.append("rolled back"))
        raise RuntimeError("the transaction fails")
    assert sent == ["first", "delete", "commit"]
