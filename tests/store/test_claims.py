"""Claims: claim, claim_next, mark_running, renew, verify_claim, claim_authority (SPEC §3.1, §3.2,
§11 items 28-43) and the claim invariants of SPEC §9 (1, 8, 9)."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.store.conftest import LEASE, at, reserve_args, rows, snapshot
from tests.store.readers import (
    events,
    lease_row,
    ms,
    one,
    queue_row,
    revision,
    run_row,
    viewer_targets,
)
from tether import open_store
from tether.errors import InvalidInput
from tether.store import RunRecord, Store
from tether.store.records import Actor

BUMP_TARGETS = [("summary", ""), ("graph", ""), ("replay", ""), ("inspector", "run")]
STATUS_TARGETS = [("summary", ""), ("replay", "")]

Reserve = Callable[..., RunRecord]
Claimed = Callable[..., RunRecord]


# -- reading stored rows ---------------------------------------------------------------------


def viewer_revision(store: Store, run_id: str = "run-1") -> int:
    return int(
        one(store, "SELECT presentation_revision FROM viewer_runs WHERE run_id = ?", run_id)[
            "presentation_revision"
        ]
    )


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def waiting_for_input(store: Store, claimed: Claimed, run_id: str = "run-1", now: int = 0) -> str:
    """A parked run whose durable status is waiting on a pending interactive request. Its id."""
    token = f"tok-{run_id}"
    claimed(run_id, now=now)
    store.set_run_status(run_id=run_id, claim_token=token, status="running", now=at(now))
    attempt = store.attempt_start(run_id=run_id, claim_token=token, node_id="ask", now=at(now))
    with store.transaction():
        request = store.request_open(
            run_id=run_id,
            claim_token=token,
            attempt_id=attempt.attempt_id,
            kind="question",
            payload={"q": 1},
            now=at(now),
        )
        assert store.park(run_id=run_id, claim_token=token, now=at(now))
    return request.request_id


def no_progress(store: Store, claimed: Claimed, run_id: str = "run-1", now: int = 0) -> None:
    """A run parked by its runner for making no progress (error code runnerNoProgress)."""
    claimed(run_id, now=now)
    assert store.park_for_no_progress(
        run_id=run_id, claim_token=f"tok-{run_id}", detail="no progress", now=at(now)
    )


def claim(
    store: Store, run_id: str = "run-1", runner: str = "host-b", token: str = "tok-b", now: int = 0
) -> RunRecord | None:
    return store.claim(run_id=run_id, runner_id=runner, claim_token=token, lease_ms=LEASE, now=at(now))


# -- claim -----------------------------------------------------------------------------------
def test_claim__returns_token_generation_and_starting_status(store: Store, reserve: Reserve) -> None:
    reserve()
    record = claim(store, runner="host-a", token="tok-1", now=100)

    assert record is not None
    assert record.claim_token == "tok-1"
    assert record.claim_generation == 1
    assert record.runner_id == "host-a"
    assert record.status == "starting"
    assert record.claim_expires_at == at(100 + LEASE)
    assert record.updated_at == at(100)
    lease = lease_row(store)
    assert lease["generation"] == 1
    assert (lease["owner_type"], lease["owner_id"]) == ("host", "host-a")
    assert lease["token_hash"] == digest("tok-1")
    assert (lease["acquired_at"], lease["heartbeat_at"], lease["expires_at"]) == (
        ms(100),
        ms(100),
        ms(100 + LEASE),
    )
    assert queue_row(store)["status"] == "starting"
    # A later read never shows the token.
    stored = store.get_run("run-1")
    assert stored is not None and stored.claim_token is None and stored.claim_generation == 1


def test_claim__emits_lease_claimed_at_next_revision_with_one_viewer_revision(
    store: Store, reserve: Reserve
) -> None:
    reserve()
    claim(store, runner="host-a", token="tok-1", now=100)

    assert revision(store) == 2
    assert events(store)[-1] == {
        "revision": 2,
        "type": "lease.claimed",
        "actor_type": "host",
        "actor_id": "host-a",
        "generation": 1,
        "payload": {"expiresAt": "2026-01-01T00:00:30.100Z"},
    }
    assert viewer_revision(store) == 2
    assert viewer_targets(store, 2) == BUMP_TARGETS


def test_claim__clears_queue_error_fields(store: Store, claimed: Claimed) -> None:
    no_progress(store, claimed)
    assert queue_row(store)["error_code"] == "runnerNoProgress"

    record = claim(store, now=10)

    assert record is not None
    assert record.error_code is None and record.error_message is None
    queue = queue_row(store)
    assert (queue["status"], queue["error_code"], queue["error_hash"]) == ("starting", None, None)
    assert queue["updated_at"] == ms(10)


def test_claim__second_claim_after_release_raises_generation_again(store: Store, claimed: Claimed) -> None:
    claimed()
    assert store.park(run_id="run-1", claim_token="tok-run-1", now=at(10))
    assert lease_row(store)["generation"] == 1

    record = claim(store, now=20)

    assert record is not None and record.claim_generation == 2
    assert lease_row(store)["generation"] == 2
    assert events(store)[-1]["generation"] == 2


@pytest.mark.parametrize("ending", ["done", "failed", "cancelled"])
def test_claim__refuses_terminal_run(store: Store, reserve: Reserve, claimed: Claimed, ending: str) -> None:
    if ending == "done":
        claimed()
        assert store.complete(run_id="run-1", claim_token="tok-run-1", now=at(10))
    elif ending == "failed":
        reserve()
        assert store.fail(run_id="run-1", error_code="boom", error_message="broken", now=at(10))
    else:
        reserve()
        assert store.cancel(run_id="run-1", now=at(10))
    assert queue_row(store)["status"] == ending
    before = snapshot(store)

    assert claim(store, now=LEASE * 3) is None
    assert (
        store.claim_for_control(
            run_id="run-1", runner_id="host-b", claim_token="c", lease_ms=LEASE, now=at(LEASE * 3)
        )
        is None
    )
    assert (
        store.claim_for_interaction_validation(
            run_id="run-1", runner_id="host-b", claim_token="c", lease_ms=LEASE, now=at(LEASE * 3)
        )
        is None
    )
    assert snapshot(store) == before


def test_claim__refuses_unknown_run(store: Store) -> None:
    before = snapshot(store)
    assert claim(store, run_id="missing") is None
    assert snapshot(store) == before


def test_claim__refuses_run_with_pending_request(store: Store, claimed: Claimed) -> None:
    waiting_for_input(store, claimed)
    before = snapshot(store)

    assert claim(store, now=100) is None
    assert claim(store, runner="host-a", token="tok-again", now=100) is None
    assert snapshot(store) == before


@pytest.mark.parametrize("variant", ["claim", "claim_for_control", "claim_for_interaction_validation"])
def test_claim__refuses_live_lease_of_another_runner(store: Store, claimed: Claimed, variant: str) -> None:
    claimed()
    before = snapshot(store)

    method = getattr(store, variant)
    record = method(
        run_id="run-1", runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(LEASE - 1)
    )

    assert record is None
    assert snapshot(store) == before
    assert store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(LEASE - 1))


def test_claim__ignores_available_at(store: Store, reserve: Reserve) -> None:
    reserve(now=at(5000))

    record = claim(store, now=10)

    assert record is not None and record.status == "starting"


def test_claim__keeps_paused_flag(store: Store, claimed: Claimed) -> None:
    waiting_for_input(store, claimed)
    assert store.pause_parked(run_id="run-1", now=at(10))

    assert store.claim_for_control(
        run_id="run-1", runner_id="host-c", claim_token="tok-c", lease_ms=LEASE, now=at(20)
    )

    assert run_row(store)["paused"] == 1
    assert store.is_paused("run-1")


def test_claim__same_runner_reclaim_voids_old_token(store: Store, claimed: Claimed) -> None:
    claimed()

    record = claim(store, runner="host-a", token="tok-2", now=1000)

    assert record is not None and record.claim_generation == 2
    assert not store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(1001))
    assert store.verify_claim(run_id="run-1", claim_token="tok-2", now=at(1001))
    before = snapshot(store)
    assert not store.renew(run_id="run-1", claim_token="tok-run-1", lease_ms=LEASE, now=at(1001))
    assert not store.mark_running(run_id="run-1", claim_token="tok-run-1", now=at(1001))
    assert not store.park(run_id="run-1", claim_token="tok-run-1", now=at(1001))
    assert snapshot(store) == before


def test_claim__expired_lease_is_claimable_by_another_runner(store: Store, claimed: Claimed) -> None:
    claimed()

    record = claim(store, runner="host-b", token="tok-b", now=LEASE)

    assert record is not None
    assert (record.runner_id, record.claim_generation) == ("host-b", 2)
    assert not store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(LEASE))
    assert store.verify_claim(run_id="run-1", claim_token="tok-b", now=at(LEASE))
    assert lease_row(store)["token_hash"] == digest("tok-b")


@pytest.mark.parametrize(
    ("runner_id", "owner_type"),
    [
        ("host-1", "host"),
        ("host-", "host"),
        ("session-1", "session"),
        ("host", "session"),
        ("hostx-1", "session"),
    ],
)
def test_claim__owner_type_is_host_for_host_prefix_else_session(
    store: Store, reserve: Reserve, runner_id: str, owner_type: str
) -> None:
    reserve()
    assert claim(store, runner=runner_id) is not None

    lease = lease_row(store)
    assert (lease["owner_type"], lease["owner_id"]) == (owner_type, runner_id)
    last = events(store)[-1]
    assert (last["actor_type"], last["actor_id"]) == (owner_type, runner_id)
    authority = store.claim_authority("run-1", "tok-b")
    assert authority is not None and authority.owner_type == owner_type


def test_claim_for_interaction_validation__ignores_pending_request(store: Store, claimed: Claimed) -> None:
    waiting_for_input(store, claimed)

    record = store.claim_for_interaction_validation(
        run_id="run-1", runner_id="host-b", claim_token="tok-v", lease_ms=LEASE, now=at(100)
    )

    assert record is not None
    assert (record.claim_token, record.claim_generation, record.status) == ("tok-v", 2, "starting")
    assert store.verify_claim(run_id="run-1", claim_token="tok-v", now=at(100))
    assert events(store)[-1]["type"] == "lease.claimed"
    assert [r.status for r in store.requests(run_id="run-1")] == ["pending"]


def test_claim_for_control__keeps_queue_status_and_error_fields(store: Store, claimed: Claimed) -> None:
    no_progress(store, claimed, now=0)
    queue_before = queue_row(store)

    record = store.claim_for_control(
        run_id="run-1", runner_id="workflow-control", claim_token="tok-c", lease_ms=LEASE, now=at(100)
    )

    assert record is not None
    assert (record.status, record.error_code, record.error_message) == (
        "parked",
        "runnerNoProgress",
        "no progress",
    )
    assert queue_row(store) == queue_before
    lease = lease_row(store)
    assert (lease["generation"], lease["owner_type"], lease["owner_id"]) == (2, "session", "workflow-control")
    assert events(store)[-1]["type"] == "lease.claimed"
    assert revision(store) == events(store)[-1]["revision"]


def test_claim_for_control__allows_pending_request(store: Store, claimed: Claimed) -> None:
    waiting_for_input(store, claimed)

    record = store.claim_for_control(
        run_id="run-1", runner_id="host-c", claim_token="tok-c", lease_ms=LEASE, now=at(100)
    )

    assert record is not None and record.status == "parked"
    assert queue_row(store)["status"] == "parked"


# -- claim_next: one test per eligibility clause ---------------------------------------------
def claim_next(
    store: Store, runner: str = "host-b", token: str = "tok-n", now: int = 0, exclude: list[str] | None = None
) -> RunRecord | None:
    return store.claim_next(
        runner_id=runner, claim_token=token, lease_ms=LEASE, now=at(now), exclude_run_ids=exclude
    )


def test_claim_next__claims_queued_run(store: Store, reserve: Reserve) -> None:
    reserve()

    record = claim_next(store, now=5)

    assert record is not None
    assert (record.run_id, record.claim_token, record.claim_generation, record.status) == (
        "run-1",
        "tok-n",
        1,
        "starting",
    )
    assert events(store)[-1]["type"] == "lease.claimed"


def test_claim_next__returns_none_when_nothing_is_queued(store: Store) -> None:
    before = snapshot(store)
    assert claim_next(store) is None
    assert snapshot(store) == before


def test_claim_next__skips_runs_of_another_project(store: Store, open_at: Callable[..., Store]) -> None:
    other = open_at("other")
    other.reserve(**reserve_args("run-other"))
    before = snapshot(store)

    assert claim_next(store, now=10) is None
    assert snapshot(store) == before
    record = claim_next(other, now=10)
    assert record is not None and record.run_id == "run-other"


def test_claims__a_project_store_takes_no_run_and_no_housekeeping_work_of_another_project(
    store: Store, open_at: Callable[..., Store]
) -> None:
    """A runner's store is scoped to its project: claims by id, the housekeeping lists (validating
    answers, input clocks, expired decisions) and decision listings; the global view sees all."""
    other = open_at("other")
    other.reserve(**reserve_args("run-o", now=at(0)))
    held = other.claim(run_id="run-o", runner_id="host-o", claim_token="tok-o", lease_ms=LEASE, now=at(1))
    assert held is not None
    assert other.mark_running(run_id="run-o", claim_token="tok-o", now=at(1))
    other.set_run_status(run_id="run-o", claim_token="tok-o", status="running", now=at(1))
    attempt = other.attempt_start(
        run_id="run-o", claim_token="tok-o", node_id="ask", timeout_ms=1000, now=at(2)
    )
    other.decision_open(
        run_id="run-o", claim_token="tok-o", node_id="ask", request={"q": 1}, deadline_at=at(3), now=at(2)
    )
    with other.transaction():
        request = other.request_open(
            run_id="run-o",
            claim_token="tok-o",
            attempt_id=attempt.attempt_id,
            kind="k",
            payload={},
            now=at(2),
        )
        other.set_run_status(run_id="run-o", claim_token="tok-o", status="waiting", now=at(2))
        assert other.park(run_id="run-o", claim_token="tok-o", now=at(2))
    other.submit(request_id=request.request_id, session_id="session-1", payload={"a": 1}, now=at(3))
    glob = open_at(None)
    assert [d.run_id for d in glob.decisions(open_only=True, expired_by=at(10))] == ["run-o"]
    assert [d.run_id for d in other.decisions(open_only=True, expired_by=at(10))] == ["run-o"]
    assert glob.runs_with_validating_submissions() == ["run-o"]
    before = snapshot(store)
    assert store.decisions(open_only=True, expired_by=at(10)) == []
    assert (
        store.claim(run_id="run-o", runner_id="host-a", claim_token="tok-a", lease_ms=LEASE, now=at(50_000))
        is None
    )
    assert (
        store.claim_for_control(
            run_id="run-o", runner_id="host-a", claim_token="tok-a", lease_ms=LEASE, now=at(50_000)
        )
        is None
    )
    assert store.runs_with_validating_submissions() == []
    assert store.interaction_tick(now=at(50_000)) == []
    assert snapshot(store) == before  # the tick above opened no interval on the other's request
    assert other.interaction_tick(now=at(50_000)) == []  # opens the interval
    assert other.interaction_tick(now=at(52_000)) == ["run-o"]
    # A paused run's answer is not listed for validation until the run is resumed.
    assert other.pause_parked(run_id="run-o", now=at(53_000))
    assert glob.runs_with_validating_submissions() == []
    assert other.resume_paused_interaction(run_id="run-o", now=at(54_000))
    assert glob.runs_with_validating_submissions() == ["run-o"]


@pytest.mark.parametrize("ending", ["done", "failed", "cancelled"])
def test_claim_next__skips_terminal_queue_status(
    store: Store, reserve: Reserve, claimed: Claimed, ending: str
) -> None:
    if ending == "done":
        claimed()
        assert store.complete(run_id="run-1", claim_token="tok-run-1", now=at(1))
    elif ending == "failed":
        reserve()
        assert store.fail(run_id="run-1", error_code="boom", error_message="broken", now=at(1))
    else:
        reserve()
        assert store.cancel(run_id="run-1", now=at(1))
    before = snapshot(store)

    assert claim_next(store, now=LEASE * 2) is None
    assert snapshot(store) == before


def test_claim_next__claims_parked_run(store: Store, claimed: Claimed) -> None:
    claimed()
    assert store.park(run_id="run-1", claim_token="tok-run-1", now=at(5))

    record = claim_next(store, now=10)

    assert record is not None and (record.run_id, record.claim_generation) == ("run-1", 2)


def test_claim_next__skips_run_not_yet_available(store: Store, reserve: Reserve) -> None:
    reserve(now=at(1000))
    before = snapshot(store)

    assert claim_next(store, now=999) is None
    assert snapshot(store) == before
    record = claim_next(store, now=1000)
    assert record is not None and record.run_id == "run-1"


def test_claim_next__skips_live_lease_of_another_runner(store: Store, claimed: Claimed) -> None:
    claimed()
    before = snapshot(store)

    assert claim_next(store, runner="host-b", now=LEASE - 1) is None
    assert snapshot(store) == before


def test_claim_next__claims_expired_lease(store: Store, claimed: Claimed) -> None:
    claimed()

    record = claim_next(store, runner="host-b", now=LEASE)

    assert record is not None
    assert (record.runner_id, record.claim_generation) == ("host-b", 2)
    assert not store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(LEASE))


def test_claim_next__claims_live_lease_of_the_same_runner(store: Store, claimed: Claimed) -> None:
    claimed()

    record = claim_next(store, runner="host-a", token="tok-fresh", now=10)

    assert record is not None
    assert (record.runner_id, record.claim_generation, record.status) == ("host-a", 2, "starting")
    assert not store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(10))


def test_claim_next__skips_parked_run_whose_durable_status_is_waiting(store: Store, claimed: Claimed) -> None:
    claimed()
    for status in ("running", "waiting"):
        store.set_run_status(run_id="run-1", claim_token="tok-run-1", status=status, now=at(1))
    assert store.park(run_id="run-1", claim_token="tok-run-1", now=at(2))
    assert store.requests(run_id="run-1") == []
    before = snapshot(store)

    assert claim_next(store, now=10) is None
    assert snapshot(store) == before


def test_claim_next__skips_parked_paused_run(store: Store, claimed: Claimed) -> None:
    # A paused run whose request was since answered: parked, durable status running, paused.
    request_id = waiting_for_input(store, claimed)
    assert store.pause_parked(run_id="run-1", now=at(10))
    submission = store.submit(request_id=request_id, session_id="session-1", payload={"a": 1}, now=at(20))
    assert store.claim_for_interaction_validation(
        run_id="run-1", runner_id="host-a", claim_token="tok-v", lease_ms=LEASE, now=at(30)
    )
    store.submission_resolve(
        run_id="run-1", claim_token="tok-v", submission_id=submission.submission_id, accepted=True, now=at(40)
    )
    assert store.park(run_id="run-1", claim_token="tok-v", now=at(50))
    assert (queue_row(store)["status"], run_row(store)["status"], run_row(store)["paused"]) == (
        "parked",
        "running",
        1,
    )
    assert store.requests(run_id="run-1", status="pending") == []
    before = snapshot(store)

    assert claim_next(store, now=100) is None
    assert snapshot(store) == before


def test_claim_next__skips_run_with_pending_request(store: Store, claimed: Claimed) -> None:
    # The request is open but the run was never parked: queue running, lease expired.
    claimed()
    store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="running", now=at(1))
    attempt = store.attempt_start(run_id="run-1", claim_token="tok-run-1", node_id="ask", now=at(1))
    store.request_open(
        run_id="run-1",
        claim_token="tok-run-1",
        attempt_id=attempt.attempt_id,
        kind="q",
        payload={},
        now=at(2),
    )
    assert queue_row(store)["status"] == "running"
    before = snapshot(store)

    assert claim_next(store, now=LEASE * 2) is None
    assert snapshot(store) == before


@pytest.mark.parametrize("method", ["park_for_no_progress", "park_for_source_change"])
def test_claim_next__skips_runs_parked_for_an_operator(store: Store, claimed: Claimed, method: str) -> None:
    claimed()
    assert getattr(store, method)(run_id="run-1", claim_token="tok-run-1", detail="stop", now=at(5))
    before = snapshot(store)

    assert claim_next(store, now=LEASE * 2) is None
    assert snapshot(store) == before


def test_claim_next__skips_excluded_runs(store: Store, reserve: Reserve) -> None:
    reserve("run-1", origin_session_id="session-1")
    reserve("run-2", origin_session_id="session-2", now=at(5))

    record = claim_next(store, now=10, exclude=["run-1"])
    assert record is not None and record.run_id == "run-2"

    before = snapshot(store)
    assert claim_next(store, runner="host-c", now=10, exclude=["run-1", "run-2"]) is None
    assert snapshot(store) == before


def test_claim_next__orders_by_available_at_then_created_at_then_run_id(
    store: Store, reserve: Reserve
) -> None:
    # run-early: created first but available last.
    reserve("run-early", origin_session_id="s-early", now=at(0))
    reserve("run-mid", origin_session_id="s-mid", now=at(10))
    assert store.request_resume(run_id="run-early", now=at(20))
    # Same available_at: run-z was created before run-y.
    reserve("run-z", origin_session_id="s-z", now=at(30))
    reserve("run-y", origin_session_id="s-y", now=at(35))
    assert store.request_resume(run_id="run-z", now=at(40))
    assert store.request_resume(run_id="run-y", now=at(40))
    # Same available_at and created_at: run id decides.
    reserve("run-b", origin_session_id="s-b", now=at(50))
    reserve("run-a", origin_session_id="s-a", now=at(50))

    order = []
    for index in range(6):
        record = claim_next(store, runner=f"host-{index}", token=f"tok-{index}", now=100)
        assert record is not None
        order.append(record.run_id)

    assert order == ["run-mid", "run-early", "run-z", "run-y", "run-a", "run-b"]
    assert claim_next(store, runner="host-9", now=100) is None


def test_claim_next__recovers_expired_starting_and_running_runs(store: Store, claimed: Claimed) -> None:
    claimed("run-1", origin_session_id="session-1", running=False)
    claimed("run-2", origin_session_id="session-2", now=1, running=True)
    assert (queue_row(store, "run-1")["status"], queue_row(store, "run-2")["status"]) == (
        "starting",
        "running",
    )
    assert claim_next(store, runner="host-b", now=LEASE - 1) is None

    first = claim_next(store, runner="host-b", token="tok-b1", now=LEASE + 1)
    second = claim_next(store, runner="host-c", token="tok-c1", now=LEASE + 1)

    assert first is not None and second is not None
    assert [(r.run_id, r.runner_id, r.claim_generation, r.status) for r in (first, second)] == [
        ("run-1", "host-b", 2, "starting"),
        ("run-2", "host-c", 2, "starting"),
    ]


def test_claim_next__global_store_claims_across_projects(
    store: Store, reserve: Reserve, open_at: Callable[..., Store]
) -> None:
    other = open_at("other")
    reserve("run-1", now=at(0))
    other.reserve(**reserve_args("run-other", origin_session_id="session-other", now=at(5)))
    everywhere = open_at(None)

    first = claim_next(everywhere, runner="host-1", now=10)
    second = claim_next(everywhere, runner="host-2", now=10)

    assert first is not None and second is not None
    assert (first.run_id, second.run_id) == ("run-1", "run-other")
    assert claim_next(everywhere, runner="host-3", now=10) is None


# -- next_lease_lapse_ms ---------------------------------------------------------------------
def test_next_lease_lapse_ms__the_earliest_live_lease_of_another_runner(
    store: Store, claimed: Claimed
) -> None:
    assert store.next_lease_lapse_ms(runner_id="host-b", now=at(0)) is None
    claimed("run-1", origin_session_id="session-1", now=500)
    claimed("run-2", origin_session_id="session-2", now=200)

    assert store.next_lease_lapse_ms(runner_id="host-b", now=at(1000)) == LEASE + 200 - 1000
    # Its own leases are not another runner's to lose; lapsed ones are claimable already.
    assert store.next_lease_lapse_ms(runner_id="host-a", now=at(1000)) is None
    assert store.next_lease_lapse_ms(runner_id="host-b", now=at(LEASE + 200)) == 300
    assert store.next_lease_lapse_ms(runner_id="host-b", now=at(LEASE + 500)) is None


def test_next_lease_lapse_ms__released_leases_and_other_projects_do_not_count(
    store: Store, claimed: Claimed, open_at: Callable[..., Store]
) -> None:
    claimed("run-1")
    assert store.park(run_id="run-1", claim_token="tok-run-1", now=at(10))
    other = open_at("other")
    other.reserve(**reserve_args("run-other", now=at(0)))
    assert other.claim(
        run_id="run-other", runner_id="host-a", claim_token="tok-o", lease_ms=LEASE, now=at(20)
    )

    assert store.next_lease_lapse_ms(runner_id="host-b", now=at(100)) is None
    assert other.next_lease_lapse_ms(runner_id="host-b", now=at(100)) == LEASE + 20 - 100
    assert open_at(None).next_lease_lapse_ms(runner_id="host-b", now=at(100)) == LEASE + 20 - 100


@pytest.mark.parametrize("runner_id", ["", None, 7])
def test_next_lease_lapse_ms__refuses_a_bad_runner_id(store: Store, claimed: Claimed, runner_id: Any) -> None:
    claimed()
    before = snapshot(store)

    with pytest.raises(InvalidInput, match="runner_id"):
        store.next_lease_lapse_ms(runner_id=runner_id, now=at(1))
    assert snapshot(store) == before


# -- mark_running ----------------------------------------------------------------------------
def test_mark_running__moves_queue_to_running_with_event(store: Store, claimed: Claimed) -> None:
    claimed(running=False)
    viewer_before = viewer_revision(store)

    assert store.mark_running(run_id="run-1", claim_token="tok-run-1", now=at(100))

    queue = queue_row(store)
    assert (queue["status"], queue["started_at"], queue["updated_at"]) == ("running", ms(100), ms(100))
    assert events(store)[-1] == {
        "revision": 3,
        "type": "run.queue_running",
        "actor_type": "host",
        "actor_id": "host-a",
        "generation": 1,
        "payload": {"status": "running"},
    }
    assert viewer_revision(store) == viewer_before + 1
    assert viewer_targets(store, viewer_before + 1) == BUMP_TARGETS


def test_mark_running__with_the_run_status_in_one_transaction_journals_one_entry(
    store: Store, claimed: Claimed
) -> None:
    """``run.queue_running`` stands for ``run.running`` too when the run status follows it in the
    same transaction (a claim's first step); the run status still moves."""
    claimed(running=False)
    with store.transaction():
        assert store.mark_running(run_id="run-1", claim_token="tok-run-1", now=at(100))
        store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="running", now=at(100))

    assert run_row(store)["status"] == "running"
    assert [e["type"] for e in events(store)] == ["run.queued", "lease.claimed", "run.queue_running"]
    assert revision(store) == 3


def test_set_run_status__in_a_transaction_of_its_own_journals_run_running(
    store: Store, claimed: Claimed
) -> None:
    claimed()

    store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="running", now=at(100))

    assert [e["type"] for e in events(store)][-2:] == ["run.queue_running", "run.running"]
    assert revision(store) == 4


def test_mark_running__keeps_first_started_at_on_repeat(store: Store, claimed: Claimed) -> None:
    claimed(running=False)
    assert store.mark_running(run_id="run-1", claim_token="tok-run-1", now=at(100))
    assert store.park(run_id="run-1", claim_token="tok-run-1", now=at(200))
    assert claim(store, now=300) is not None

    assert store.mark_running(run_id="run-1", claim_token="tok-b", now=at(400))
    assert store.mark_running(run_id="run-1", claim_token="tok-b", now=at(500))

    queue = queue_row(store)
    assert (queue["status"], queue["started_at"], queue["updated_at"]) == ("running", ms(100), ms(500))


@pytest.mark.parametrize("stale", ["wrong", "expired", "superseded"])
def test_mark_running__stale_token_returns_false_and_writes_nothing(
    store: Store, claimed: Claimed, stale: str
) -> None:
    claimed(running=False)
    now = 100
    token = "tok-run-1"
    if stale == "wrong":
        token = "tok-other"
    elif stale == "expired":
        now = LEASE
    else:
        assert claim(store, runner="host-b", now=LEASE) is not None
        now = LEASE + 1
    before = snapshot(store)

    assert not store.mark_running(run_id="run-1", claim_token=token, now=at(now))
    assert snapshot(store) == before


def test_mark_running__unknown_run_returns_false(store: Store) -> None:
    before = snapshot(store)
    assert not store.mark_running(run_id="missing", claim_token="tok", now=at(0))
    assert snapshot(store) == before


# -- renew -----------------------------------------------------------------------------------
def test_renew__extends_lease_without_event_or_viewer_revision(store: Store, claimed: Claimed) -> None:
    claimed()
    events_before = events(store)
    revision_before = revision(store)
    viewer_before = viewer_revision(store)
    list_revision_before = store.list_revision()

    assert store.renew(run_id="run-1", claim_token="tok-run-1", lease_ms=60_000, now=at(10_000))

    lease = lease_row(store)
    assert (lease["acquired_at"], lease["heartbeat_at"], lease["expires_at"]) == (
        ms(0),
        ms(10_000),
        ms(70_000),
    )
    assert lease["generation"] == 1
    assert events(store) == events_before
    assert revision(store) == revision_before
    # A renewal writes the lease row and nothing else (docs/seed-departures.md).
    assert viewer_revision(store) == viewer_before
    assert store.list_revision() == list_revision_before
    assert store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(69_999))
    assert not store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(70_000))


@pytest.mark.parametrize("refusal", ["expired", "wrong", "unowned", "released", "unknown"])
def test_renew__refused_without_a_live_matching_claim(
    store: Store, reserve: Reserve, claimed: Claimed, refusal: str
) -> None:
    run_id, token, now = "run-1", "tok-run-1", 100
    if refusal == "unowned":
        reserve()
    else:
        claimed()
    if refusal == "expired":
        now = LEASE
    elif refusal == "wrong":
        token = "tok-wrong"
    elif refusal == "released":
        assert store.park(run_id="run-1", claim_token=token, now=at(50))
    elif refusal == "unknown":
        run_id = "missing"
    before = snapshot(store)

    assert not store.renew(run_id=run_id, claim_token=token, lease_ms=LEASE, now=at(now))
    assert snapshot(store) == before


# -- verify_claim ----------------------------------------------------------------------------
def test_verify_claim__false_at_exact_expiry(store: Store, claimed: Claimed) -> None:
    claimed(now=1000)

    assert store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(1000 + LEASE - 1))
    assert not store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(1000 + LEASE))
    assert not store.verify_claim(run_id="run-1", claim_token="tok-wrong", now=at(1000))
    assert not store.verify_claim(run_id="missing", claim_token="tok-run-1", now=at(1000))


# -- claim_authority -------------------------------------------------------------------------
def test_claim_authority__reports_holder_generation_and_real_lease_length(
    store: Store, claimed: Claimed
) -> None:
    claimed()

    authority = store.claim_authority("run-1", "tok-run-1")

    assert authority is not None
    assert authority.actor == Actor("host", "host-a")
    assert (authority.owner_type, authority.owner_id, authority.token) == ("host", "host-a", "tok-run-1")
    assert (authority.generation, authority.lease_ms) == (1, LEASE)

    assert store.renew(run_id="run-1", claim_token="tok-run-1", lease_ms=45_000, now=at(1000))
    renewed = store.claim_authority("run-1", "tok-run-1")
    assert renewed is not None and renewed.lease_ms == 45_000


def test_claim_authority__session_runner(store: Store, reserve: Reserve) -> None:
    reserve()
    assert store.claim(run_id="run-1", runner_id="session-9", claim_token="t", lease_ms=5_000, now=at(0))

    authority = store.claim_authority("run-1", "t")

    assert authority is not None
    assert authority.actor == Actor("session", "session-9")
    assert (authority.owner_type, authority.lease_ms) == ("session", 5_000)


def test_claim_authority__ignores_expiry(store: Store, claimed: Claimed) -> None:
    claimed()
    assert not store.verify_claim(run_id="run-1", claim_token="tok-run-1", now=at(LEASE * 10))

    authority = store.claim_authority("run-1", "tok-run-1")

    assert authority is not None and authority.generation == 1


def test_claim_authority__none_for_wrong_token_unowned_or_unknown_run(
    store: Store, reserve: Reserve, claimed: Claimed
) -> None:
    reserve("run-2", origin_session_id="session-2")
    claimed()

    assert store.claim_authority("run-1", "tok-wrong") is None
    assert store.claim_authority("run-2", "tok-run-1") is None
    assert store.claim_authority("missing", "tok-run-1") is None
    assert store.park(run_id="run-1", claim_token="tok-run-1", now=at(1))
    assert store.claim_authority("run-1", "tok-run-1") is None


# -- bad input -------------------------------------------------------------------------------
BAD_LEASES = [0, -1, True, 1.5, "30000", None, 24 * 60 * 60 * 1000 + 1]
LEASE_CALLS: dict[str, Callable[[Store, Any], Any]] = {
    "claim": lambda s, lease: s.claim(
        run_id="run-1", runner_id="host-b", claim_token="t", lease_ms=lease, now=at(LEASE)
    ),
    "claim_for_control": lambda s, lease: s.claim_for_control(
        run_id="run-1", runner_id="host-b", claim_token="t", lease_ms=lease, now=at(LEASE)
    ),
    "claim_for_interaction_validation": lambda s, lease: s.claim_for_interaction_validation(
        run_id="run-1", runner_id="host-b", claim_token="t", lease_ms=lease, now=at(LEASE)
    ),
    "claim_next": lambda s, lease: s.claim_next(
        runner_id="host-b", claim_token="t", lease_ms=lease, now=at(LEASE)
    ),
    "renew": lambda s, lease: s.renew(run_id="run-1", claim_token="tok-run-1", lease_ms=lease, now=at(10)),
}


@pytest.mark.parametrize("lease_ms", BAD_LEASES, ids=repr)
@pytest.mark.parametrize("call", list(LEASE_CALLS))
def test_lease_ms__must_be_a_positive_whole_number(
    store: Store, claimed: Claimed, call: str, lease_ms: Any
) -> None:
    claimed()
    before = snapshot(store)

    with pytest.raises(InvalidInput, match="lease_ms must be a whole number of milliseconds"):
        LEASE_CALLS[call](store, lease_ms)
    assert snapshot(store) == before


def test_lease_ms__upper_bound_is_accepted(store: Store, reserve: Reserve) -> None:
    reserve()
    record = store.claim(
        run_id="run-1", runner_id="host-a", claim_token="t", lease_ms=24 * 60 * 60 * 1000, now=at(0)
    )
    assert record is not None and record.claim_expires_at == at(24 * 60 * 60 * 1000)


# -- invariants (SPEC §9: 1, 8, 9) ------------------------------------------------------------
def stored_text(store: Store) -> list[str]:
    """Every stored text and byte value, decoded, to look for raw tokens."""
    found = []
    for table in snapshot(store).values():
        for row in table:
            for value in row:
                if isinstance(value, str):
                    found.append(value)
                elif isinstance(value, bytes):
                    found.append(value.decode("utf-8", "replace"))
    return found


def check_row_invariants(store: Store) -> None:
    """Queue finished_at set iff terminal; lease owner columns all set or all NULL."""
    for status, finished in rows(store, "SELECT status, finished_at FROM run_queue"):
        assert (finished is not None) == (status in ("done", "failed", "cancelled")), (status, finished)
    owner_columns = "owner_type, owner_id, token_hash, acquired_at, heartbeat_at, expires_at"
    for lease in rows(store, f"SELECT {owner_columns} FROM leases"):
        assert all(v is None for v in lease) or all(v is not None for v in lease), lease


def test_invariant__tokens_are_never_stored(store: Store, claimed: Claimed) -> None:
    claimed()
    assert store.renew(run_id="run-1", claim_token="tok-run-1", lease_ms=LEASE, now=at(5))
    assert claim(store, runner="host-a", token="tok-second-secret", now=10)
    assert store.park(run_id="run-1", claim_token="tok-second-secret", now=at(20))

    text = "\n".join(stored_text(store))
    assert "tok-run-1" not in text
    assert "tok-second-secret" not in text
    check_row_invariants(store)


STEP = st.one_of(
    st.tuples(
        st.just("claim"),
        st.sampled_from(["claim", "control", "validation", "next"]),
        st.sampled_from(["host-a", "host-b", "session-c"]),
    ),
    st.tuples(st.sampled_from(["renew", "mark", "park", "complete", "no_progress"]), st.integers(0, 5)),
    st.tuples(st.just("advance"), st.integers(1, 40_000)),
)


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=st.lists(STEP, min_size=1, max_size=14))
def test_invariant__at_most_one_live_claim_and_each_claim_voids_earlier_tokens(
    store_url: str, steps: list[tuple[Any, ...]]
) -> None:
    # Each example works in a project of its own, opened and closed here.
    with open_store(store_url, project=f"one-claim-{next(EXAMPLES)}") as store:
        check_claim_sequence(store, steps)


def check_claim_sequence(store: Store, steps: list[tuple[Any, ...]]) -> None:
    run_id = "run-" + store.project_id[-12:]  # type: ignore[index]
    store.reserve(**reserve_args(run_id, origin_session_id=f"session-{run_id}"))
    now = 0
    tokens: list[str] = []
    for step in steps:
        generation = lease_row(store, run_id)["generation"]
        before = snapshot(store)
        if step[0] == "advance":
            now += step[1]
            continue
        if step[0] == "claim":
            token = f"secret-{len(tokens)}-{run_id}"
            kind, runner = step[1], step[2]
            kwargs = {"runner_id": runner, "claim_token": token, "lease_ms": LEASE, "now": at(now)}
            if kind == "next":
                record = store.claim_next(**kwargs)
            else:
                method = {
                    "claim": store.claim,
                    "control": store.claim_for_control,
                    "validation": store.claim_for_interaction_validation,
                }[kind]
                record = method(run_id=run_id, **kwargs)
            if record is None:
                assert snapshot(store) == before
                assert lease_row(store, run_id)["generation"] == generation
            else:
                assert record.claim_generation == generation + 1
                assert lease_row(store, run_id)["generation"] == generation + 1
                assert all(not store.verify_claim(run_id=run_id, claim_token=t, now=at(now)) for t in tokens)
                tokens.append(token)
        else:
            token = tokens[step[1] % len(tokens)] if tokens else "never-issued"
            live = store.verify_claim(run_id=run_id, claim_token=token, now=at(now))
            args: dict[str, Any] = {"run_id": run_id, "claim_token": token, "now": at(now)}
            moves: dict[str, tuple[Callable[..., bool], dict[str, Any]]] = {
                "renew": (store.renew, {"lease_ms": LEASE}),
                "mark": (store.mark_running, {}),
                "park": (store.park, {}),
                "complete": (store.complete, {}),
                "no_progress": (store.park_for_no_progress, {"detail": "stuck"}),
            }
            move, extra = moves[step[0]]
            result = move(**args, **extra)
            if not live:
                assert result is False
                assert snapshot(store) == before
            assert lease_row(store, run_id)["generation"] == generation
        holders = [t for t in tokens if store.verify_claim(run_id=run_id, claim_token=t, now=at(now))]
        assert len(holders) <= 1
        check_row_invariants(store)
    text = "\n".join(stored_text(store))
    assert not any(t in text for t in tokens)


EXAMPLES = itertools.count()
NOW = 100_000
RUNNER = "host-next"
#: How each generated run is prepared before claim_next runs at NOW, and whether it is eligible.
CONFIGS: dict[str, bool] = {
    "queued": True,
    "future": False,
    "live_other": False,
    "live_self": True,
    "expired_starting": True,
    "expired_running": True,
    "parked": True,
    "resumed": True,
    "parked_waiting": False,
    "parked_paused": False,
    "pending_request": False,
    "waiting_for_input": False,
    "no_progress": False,
    "source_change": False,
    "effect_ambiguous": False,
    "done": False,
    "failed": False,
    "cancelled": False,
    "excluded": False,
    "other_project": False,
}


def prepare(store: Store, other: Store, run_id: str, config: str, t: int) -> None:
    """Put one run into the state named by ``config``; its queue times come from ``t``."""
    target = other if config == "other_project" else store
    reserve_at = NOW + 1 + t if config == "future" else t
    target.reserve(**reserve_args(run_id, origin_session_id=f"session-{run_id}", now=at(reserve_at)))
    token = f"tok-{run_id}"
    if config in ("queued", "future", "excluded", "other_project"):
        return
    if config == "failed":
        assert store.fail(run_id=run_id, error_code="boom", error_message="x", now=at(t))
        return
    if config == "cancelled":
        assert store.cancel(run_id=run_id, now=at(t))
        return
    live = config in ("live_other", "live_self")
    claim_at = NOW - 10_000 if live else t
    runner = RUNNER if config == "live_self" else "host-other"
    assert store.claim(run_id=run_id, runner_id=runner, claim_token=token, lease_ms=LEASE, now=at(claim_at))
    args: dict[str, Any] = {"run_id": run_id, "claim_token": token, "now": at(claim_at)}
    if live or config == "expired_starting":
        return
    assert store.mark_running(**args)
    if config == "expired_running":
        return
    if config == "parked":
        assert store.park(**args)
    elif config == "done":
        assert store.complete(**args)
    elif config in ("no_progress", "resumed"):
        assert store.park_for_no_progress(detail="stuck", **args)
        if config == "resumed":
            assert store.request_resume(run_id=run_id, now=at(t + 10))
    elif config == "source_change":
        assert store.park_for_source_change(detail="changed", **args)
    else:
        store.set_run_status(status="running", **args)
        if config == "effect_ambiguous":
            assert store.park_for_ambiguous_effect(**args)
        elif config == "parked_waiting":
            store.set_run_status(status="waiting", **args)
            assert store.park(**args)
        else:
            attempt = store.attempt_start(node_id="n", **args)
            request = store.request_open(attempt_id=attempt.attempt_id, kind="q", payload={}, **args)
            if config == "pending_request":
                return
            assert store.park(**args)
            if config == "waiting_for_input":
                return
            assert config == "parked_paused"
            assert store.pause_parked(run_id=run_id, now=at(t))
            submission = store.submit(
                request_id=request.request_id, session_id=f"session-{run_id}", payload={}, now=at(t)
            )
            validation: dict[str, Any] = {"run_id": run_id, "claim_token": "tok-v", "now": at(t)}
            assert store.claim_for_interaction_validation(runner_id="host-v", lease_ms=LEASE, **validation)
            store.submission_resolve(submission_id=submission.submission_id, accepted=True, **validation)
            assert store.park(**validation)


ELIGIBLE = sorted(c for c, ok in CONFIGS.items() if ok)
INELIGIBLE = sorted(c for c, ok in CONFIGS.items() if not ok)
TIMES = st.sampled_from([0, 10, 20])


def eligible_from_rows(store: Store, project_id: str, excluded: list[str]) -> list[tuple[int, int, str]]:
    """The claim_next candidates of SPEC §3.2, read straight from the rows, with their sort keys."""
    found = rows(
        store,
        "SELECT q.run_id, q.status, q.available_at, q.created_at, q.error_code, r.project_id, r.status, "
        "r.paused, l.owner_id, l.expires_at, "
        "EXISTS (SELECT 1 FROM interactive_requests i WHERE i.run_id = q.run_id AND i.status = 'pending') "
        "FROM run_queue q JOIN runs r ON r.run_id = q.run_id JOIN leases l ON l.resource_id = r.resource_id",
    )
    now = ms(NOW)
    candidates = []
    for (
        run_id,
        status,
        available,
        created,
        code,
        project,
        run_status,
        paused,
        owner,
        expires,
        pending,
    ) in found:
        if (
            project == project_id
            and status in ("queued", "parked", "starting", "running")
            and available <= now
            and (owner is None or expires <= now or owner == RUNNER)
            and not (status == "parked" and (run_status == "waiting" or paused == 1))
            and not pending
            and code not in ("workflowSourceChanged", "runnerNoProgress")
            and run_id not in excluded
        ):
            candidates.append((available, created, run_id))
    return candidates


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    # A few eligible runs (their order is checked) among several distinct ineligible ones.
    population=st.tuples(
        st.lists(st.tuples(st.sampled_from(ELIGIBLE), TIMES), max_size=4),
        st.lists(
            st.tuples(st.sampled_from(INELIGIBLE), TIMES), min_size=2, max_size=4, unique_by=lambda p: p[0]
        ),
    ).map(lambda pair: pair[0] + pair[1]),
    names=st.permutations("abcdefgh"),
)
def test_invariant__claim_next_returns_only_eligible_runs_in_queue_order(
    store_url: str, population: list[tuple[str, int]], names: list[str]
) -> None:
    # Each example works in projects of its own, opened and closed here.
    example = next(EXAMPLES)
    with (
        open_store(store_url, project=f"population-{example}") as store,
        open_store(store_url, project=f"population-{example}-other") as other,
    ):
        check_claim_next_population(store, other, example, population, names)


def check_claim_next_population(
    store: Store, other: Store, example: int, population: list[tuple[str, int]], names: list[str]
) -> None:
    prefix = f"p{example}-"
    excluded = []
    for (config, t), name in zip(population, names, strict=False):
        prepare(store, other, prefix + name, config, t)
        if config == "excluded":
            excluded.append(prefix + name)
    candidates = eligible_from_rows(store, store.project_id or "", excluded)
    assert {c[2] for c in candidates} == {
        prefix + name for (config, _), name in zip(population, names, strict=False) if CONFIGS[config]
    }
    # Drain the queue: each call must return the next candidate in order, never another run.
    taken: list[str] = []
    for attempt in range(len(population) + 1):
        before = snapshot(store) if attempt == len(candidates) else None
        record = store.claim_next(
            runner_id=RUNNER,
            claim_token=f"tok-next-{attempt}",
            lease_ms=LEASE,
            now=at(NOW),
            exclude_run_ids=(excluded + taken) or None,
        )
        if record is None:
            assert before is None or snapshot(store) == before
            break
        assert (record.runner_id, record.status, record.claim_token) == (
            RUNNER,
            "starting",
            f"tok-next-{attempt}",
        )
        taken.append(record.run_id)
    assert taken == [run_id for _, _, run_id in sorted(candidates)]
    check_row_invariants(store)
