"""Moves under a claim and control moves: park, complete, the special parks, pause and resume
(SPEC §3.1, §3.2, §11 items 44-57) and SPEC §9 invariant 2 (a stale claimer writes nothing)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tests.store.conftest import LEASE, at, rows, snapshot
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
from tether.errors import ClaimLost, InconsistentState, InvalidInput
from tether.store import RunRecord, Store
from tether.store.states import QueueStatus, RunStatus
from tether.values import token_hash

BUMP_TARGETS = [("summary", ""), ("graph", ""), ("replay", ""), ("inspector", "run")]
STATUS_TARGETS = [("summary", ""), ("replay", "")]
TOKEN = "tok-run-1"
AMBIGUOUS_DETAIL = "effect outcome is ambiguous; explicit recovery is required"

Reserve = Callable[..., RunRecord]
Claimed = Callable[..., RunRecord]


# -- reading stored rows ---------------------------------------------------------------------


def viewer_revision(store: Store, run_id: str = "run-1") -> int:
    found = one(store, "SELECT presentation_revision FROM viewer_runs WHERE run_id = ?", run_id)
    return int(found["presentation_revision"])


def effect_events(store: Store, effect_id: str) -> list[tuple[Any, ...]]:
    found = rows(
        store,
        "SELECT e.resource_revision, e.event_type, e.actor_type, e.actor_id, "
        "COALESCE(e.payload, CAST(b.content AS TEXT)) FROM events e "
        "JOIN effects f ON f.resource_id = e.resource_id LEFT JOIN blobs b ON b.blob_hash = e.payload_hash "
        "WHERE f.effect_id = ? ORDER BY e.event_seq",
        effect_id,
    )
    return [(r[0], r[1], r[2], r[3], json.loads(r[4])) for r in found]


def effect_row(store: Store, effect_id: str) -> dict[str, Any]:
    return one(store, "SELECT * FROM effects WHERE effect_id = ?", effect_id)


def text_blob(store: Store, blob_hash: bytes | None) -> str | None:
    if blob_hash is None:
        return None
    return bytes(one(store, "SELECT content FROM blobs WHERE blob_hash = ?", blob_hash)["content"]).decode()


def assert_released(store: Store, generation: int, run_id: str = "run-1") -> None:
    lease = lease_row(store, run_id)
    assert lease["generation"] == generation
    owner = ("owner_type", "owner_id", "token_hash", "acquired_at", "heartbeat_at", "expires_at")
    assert [lease[c] for c in owner] == [None] * 6


# -- preparing runs --------------------------------------------------------------------------
def running(store: Store, claimed: Claimed, run_id: str = "run-1", now: int = 0, **overrides: Any) -> None:
    """A claimed, marked run whose durable status the engine moved to running."""
    claimed(run_id, now=now, **overrides)
    store.set_run_status(run_id=run_id, claim_token=f"tok-{run_id}", status="running", now=at(now))


def waiting_for_input(store: Store, claimed: Claimed, now: int = 0) -> str:
    """run-1 parked and waiting on a pending interactive request. The request id."""
    running(store, claimed, now=now)
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="ask", now=at(now))
    with store.transaction():
        request = store.request_open(
            run_id="run-1",
            claim_token=TOKEN,
            attempt_id=attempt.attempt_id,
            kind="question",
            payload={"q": 1},
            now=at(now),
        )
        assert store.park(run_id="run-1", claim_token=TOKEN, now=at(now))
    return request.request_id


def ambiguous_effect(store: Store, claimed: Claimed) -> str:
    """run-1 parked for an effect left applying: its outcome is ambiguous. The effect id."""
    running(store, claimed)
    effect = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="mail.send", idempotency_key="mail-1", now=at(1)
    )
    store.effect_begin(run_id="run-1", claim_token=TOKEN, effect_id=effect.effect_id, now=at(2))
    store.effect_mark_ambiguous(run_id="run-1", claim_token=TOKEN, effect_id=effect.effect_id, now=at(3))
    assert store.park_for_ambiguous_effect(run_id="run-1", claim_token=TOKEN, now=at(4))
    return effect.effect_id


def answered_while_paused(store: Store, claimed: Claimed) -> None:
    """run-1 paused while waiting, then its request answered under a validation claim."""
    request_id = waiting_for_input(store, claimed)
    assert store.pause_parked(run_id="run-1", now=at(10))
    submission = store.submit(request_id=request_id, session_id="session-1", payload={"a": 1}, now=at(20))
    assert store.claim_for_interaction_validation(
        run_id="run-1", runner_id="host-v", claim_token="tok-v", lease_ms=LEASE, now=at(30)
    )
    store.submission_resolve(
        run_id="run-1", claim_token="tok-v", submission_id=submission.submission_id, accepted=True, now=at(40)
    )


def stale_token(store: Store, kind: str) -> tuple[str, int]:
    """Make the claim ``tok-run-1`` stale in the way ``kind`` names. The token and time to use."""
    if kind == "wrong":
        return "tok-wrong", 100
    if kind == "expired":
        return TOKEN, LEASE
    if kind == "superseded":
        assert store.claim(
            run_id="run-1", runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(LEASE)
        )
        return TOKEN, LEASE + 1
    if kind == "reclaimed":
        assert store.claim(
            run_id="run-1", runner_id="host-a", claim_token="tok-2", lease_ms=LEASE, now=at(100)
        )
        return TOKEN, 101
    assert kind == "released"
    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(100))
    return TOKEN, 101


STALE_KINDS = ["wrong", "expired", "superseded", "reclaimed", "released"]


# -- park and complete -----------------------------------------------------------------------
def test_park__parks_run_and_clears_lease_but_keeps_generation(store: Store, claimed: Claimed) -> None:
    running(store, claimed)
    queue_before = queue_row(store)
    run_before = run_row(store)

    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(1000))

    queue = queue_row(store)
    assert (queue["status"], queue["finished_at"], queue["updated_at"]) == ("parked", None, ms(1000))
    assert queue["available_at"] == queue_before["available_at"]
    assert queue["started_at"] == queue_before["started_at"]
    assert_released(store, generation=1)
    assert run_row(store) == run_before
    record = store.get_run("run-1")
    assert record is not None
    assert (record.status, record.runner_id, record.claim_generation, record.claim_expires_at) == (
        "parked",
        None,
        None,
        None,
    )


def test_park__emits_queue_parked_with_owner_actor_and_two_viewer_revisions(
    store: Store, claimed: Claimed
) -> None:
    running(store, claimed)
    revision_before = revision(store)
    viewer_before = viewer_revision(store)

    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(1000))

    assert revision(store) == revision_before + 1
    assert events(store)[-1] == {
        "revision": revision_before + 1,
        "type": "run.queue_parked",
        "actor_type": "host",
        "actor_id": "host-a",
        "generation": 1,
        "payload": {"status": "parked"},
    }
    assert viewer_revision(store) == viewer_before + 2
    assert viewer_targets(store, viewer_before + 1) == BUMP_TARGETS
    assert viewer_targets(store, viewer_before + 2) == STATUS_TARGETS


def test_park__settles_pending_park_queue_effects_only(store: Store, claimed: Claimed) -> None:
    running(store, claimed)
    enqueue = store.effect_enqueue
    park_effect = enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="run.park_queue", idempotency_key="p", now=at(5)
    )
    settle_effect = enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="run.settle_queue", idempotency_key="s", now=at(5)
    )
    other_effect = enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="mail.send", idempotency_key="m", now=at(5)
    )

    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(1000))

    settled = effect_row(store, park_effect.effect_id)
    assert (settled["status"], settled["settled_at"], settled["updated_at"]) == (
        "applied",
        ms(1000),
        ms(1000),
    )
    assert effect_events(store, park_effect.effect_id)[-1] == (
        2,
        "effect.applied",
        "system",
        None,
        {"runId": "run-1", "effectId": park_effect.effect_id, "effectType": "run.park_queue"},
    )
    for untouched in (settle_effect, other_effect):
        row = effect_row(store, untouched.effect_id)
        assert (row["status"], row["settled_at"]) == ("pending", None)
        assert len(effect_events(store, untouched.effect_id)) == 1


def test_park__keeps_available_at_and_error_fields_under_a_control_claim(
    store: Store, claimed: Claimed
) -> None:
    claimed()
    assert store.park_for_no_progress(run_id="run-1", claim_token=TOKEN, detail="stuck", now=at(500))
    assert store.claim_for_control(
        run_id="run-1", runner_id="workflow-control", claim_token="tok-c", lease_ms=LEASE, now=at(600)
    )
    queue_before = queue_row(store)

    assert store.park(run_id="run-1", claim_token="tok-c", now=at(700))

    queue = queue_row(store)
    for column in ("available_at", "error_code", "error_hash", "started_at", "finished_at"):
        assert queue[column] == queue_before[column], column
    assert queue["status"] == "parked" and queue["error_code"] == "runnerNoProgress"
    assert_released(store, generation=2)


def test_complete__finishes_queue_and_settles_settle_queue_effects(store: Store, claimed: Claimed) -> None:
    running(store, claimed)
    park_effect = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="run.park_queue", idempotency_key="p", now=at(5)
    )
    settle_effect = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="run.settle_queue", idempotency_key="s", now=at(5)
    )
    run_before = run_row(store)
    revision_before = revision(store)
    viewer_before = viewer_revision(store)

    assert store.complete(run_id="run-1", claim_token=TOKEN, now=at(2000))

    queue = queue_row(store)
    assert (queue["status"], queue["finished_at"], queue["updated_at"]) == ("done", ms(2000), ms(2000))
    assert_released(store, generation=1)
    assert run_row(store) == run_before
    assert events(store)[-1] == {
        "revision": revision_before + 1,
        "type": "run.queue_done",
        "actor_type": "host",
        "actor_id": "host-a",
        "generation": 1,
        "payload": {"status": "done"},
    }
    assert viewer_revision(store) == viewer_before + 2
    settled = effect_row(store, settle_effect.effect_id)
    assert (settled["status"], settled["settled_at"]) == ("applied", ms(2000))
    assert effect_events(store, settle_effect.effect_id)[-1][1:] == (
        "effect.applied",
        "system",
        None,
        {"runId": "run-1", "effectId": settle_effect.effect_id, "effectType": "run.settle_queue"},
    )
    assert effect_row(store, park_effect.effect_id)["status"] == "pending"
    record = store.get_run("run-1")
    assert record is not None and record.finished_at == at(2000)


def test_complete__from_starting_without_mark_running(store: Store, claimed: Claimed) -> None:
    claimed(running=False)

    assert store.complete(run_id="run-1", claim_token=TOKEN, now=at(10))

    queue = queue_row(store)
    assert (queue["status"], queue["started_at"], queue["finished_at"]) == ("done", None, ms(10))


@pytest.mark.parametrize("kind", STALE_KINDS)
@pytest.mark.parametrize("move", ["park", "complete"])
def test_park_and_complete__stale_token_returns_false_and_writes_nothing(
    store: Store, claimed: Claimed, move: str, kind: str
) -> None:
    running(store, claimed)
    store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type=f"run.{move}_queue", idempotency_key="e", now=at(5)
    )
    token, now = stale_token(store, kind)
    before = snapshot(store)

    assert getattr(store, move)(run_id="run-1", claim_token=token, now=at(now)) is False
    assert snapshot(store) == before


def test_park_and_complete__unknown_run_returns_false(store: Store) -> None:
    before = snapshot(store)
    assert not store.park(run_id="missing", claim_token=TOKEN, now=at(0))
    assert not store.complete(run_id="missing", claim_token=TOKEN, now=at(0))
    assert snapshot(store) == before


# -- special parks ---------------------------------------------------------------------------
SPECIAL_PARKS = [
    ("park_for_no_progress", "runnerNoProgress", "run.worker_no_progress"),
    ("park_for_source_change", "workflowSourceChanged", "run.source_changed"),
]
SPECIAL_IDS = ["no_progress", "source_change"]


@pytest.mark.parametrize(("method", "code", "event"), SPECIAL_PARKS, ids=SPECIAL_IDS)
def test_special_park__parks_with_error_code_and_releases(
    store: Store, claimed: Claimed, method: str, code: str, event: str
) -> None:
    running(store, claimed)
    revision_before = revision(store)
    viewer_before = viewer_revision(store)

    assert getattr(store, method)(run_id="run-1", claim_token=TOKEN, detail="the reason", now=at(700))

    queue = queue_row(store)
    assert (queue["status"], queue["error_code"], queue["available_at"], queue["finished_at"]) == (
        "parked",
        code,
        ms(700),
        None,
    )
    assert text_blob(store, queue["error_hash"]) == "the reason"
    run = run_row(store)
    assert (run["status"], run["status_detail"], run["finished_at"]) == ("running", "the reason", None)
    assert_released(store, generation=1)
    assert events(store)[-1] == {
        "revision": revision_before + 1,
        "type": event,
        "actor_type": "host",
        "actor_id": "host-a",
        "generation": 1,
        "payload": {"status": "parked", "code": code},
    }
    assert viewer_revision(store) == viewer_before + 2
    assert viewer_targets(store, viewer_before + 2) == STATUS_TARGETS
    record = store.get_run("run-1")
    assert record is not None and (record.error_code, record.error_message) == (code, "the reason")


@pytest.mark.parametrize(("method", "code", "event"), SPECIAL_PARKS, ids=SPECIAL_IDS)
@pytest.mark.parametrize("unit", ["x", "é", "😀"], ids=["ascii", "bmp", "astral"])
def test_special_park__cuts_detail_at_8192_characters(
    store: Store, claimed: Claimed, method: str, code: str, event: str, unit: str
) -> None:
    running(store, claimed)

    assert getattr(store, method)(run_id="run-1", claim_token=TOKEN, detail=unit * 9000, now=at(700))

    assert run_row(store)["status_detail"] == unit * 8192
    assert text_blob(store, queue_row(store)["error_hash"]) == unit * 8192
    record = store.get_run("run-1")
    assert record is not None and record.error_message == unit * 8192


@pytest.mark.parametrize(("method", "code", "event"), SPECIAL_PARKS, ids=SPECIAL_IDS)
def test_special_park__detail_of_exactly_8192_characters_is_kept_whole(
    store: Store, claimed: Claimed, method: str, code: str, event: str
) -> None:
    running(store, claimed)
    detail = "a" * 8191 + "z"

    assert getattr(store, method)(run_id="run-1", claim_token=TOKEN, detail=detail, now=at(700))

    assert run_row(store)["status_detail"] == detail


@pytest.mark.parametrize(("method", "code", "event"), SPECIAL_PARKS, ids=SPECIAL_IDS)
def test_special_park__claim_next_skips_it_until_resumed(
    store: Store, claimed: Claimed, method: str, code: str, event: str
) -> None:
    running(store, claimed)
    assert getattr(store, method)(run_id="run-1", claim_token=TOKEN, detail="stop", now=at(700))
    before = snapshot(store)

    for runner in ("host-a", "host-b"):
        assert store.claim_next(runner_id=runner, claim_token="n", lease_ms=LEASE, now=at(LEASE * 5)) is None
    assert snapshot(store) == before
    assert store.request_resume(run_id="run-1", now=at(LEASE * 5))
    record = store.claim_next(runner_id="host-b", claim_token="n", lease_ms=LEASE, now=at(LEASE * 5))
    assert record is not None and record.run_id == "run-1" and record.error_code is None


@pytest.mark.parametrize(("method", "code", "event"), SPECIAL_PARKS, ids=SPECIAL_IDS)
def test_special_park__keeps_finished_at_of_a_waiting_run(
    store: Store, claimed: Claimed, method: str, code: str, event: str
) -> None:
    running(store, claimed)
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="waiting", now=at(50))
    assert run_row(store)["finished_at"] == ms(50)

    assert getattr(store, method)(run_id="run-1", claim_token=TOKEN, detail="stop", now=at(700))

    run = run_row(store)
    assert (run["status"], run["status_detail"], run["finished_at"]) == ("waiting", "stop", ms(50))


@pytest.mark.parametrize(("method", "code", "event"), SPECIAL_PARKS, ids=SPECIAL_IDS)
def test_special_park__from_starting_with_durable_status_queued(
    store: Store, claimed: Claimed, method: str, code: str, event: str
) -> None:
    claimed(running=False)

    assert getattr(store, method)(run_id="run-1", claim_token=TOKEN, detail="stop", now=at(10))

    assert (queue_row(store)["status"], run_row(store)["status"]) == ("parked", "queued")
    assert run_row(store)["finished_at"] is None


@pytest.mark.parametrize("kind", STALE_KINDS)
@pytest.mark.parametrize(("method", "code", "event"), SPECIAL_PARKS, ids=SPECIAL_IDS)
def test_special_park__stale_token_returns_false_and_writes_nothing(
    store: Store, claimed: Claimed, method: str, code: str, event: str, kind: str
) -> None:
    running(store, claimed)
    token, now = stale_token(store, kind)
    before = snapshot(store)

    assert getattr(store, method)(run_id="run-1", claim_token=token, detail="stop", now=at(now)) is False
    assert snapshot(store) == before


# -- ambiguous-effect park -------------------------------------------------------------------
def test_park_for_ambiguous_effect__moves_attempts_run_and_queue(store: Store, claimed: Claimed) -> None:
    running(store, claimed)
    done = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="first", now=at(1))
    store.attempt_finish(
        run_id="run-1", claim_token=TOKEN, attempt_id=done.attempt_id, status="completed", output=1, now=at(2)
    )
    active = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="second", now=at(3))
    queue_before = queue_row(store)

    assert store.park_for_ambiguous_effect(run_id="run-1", claim_token=TOKEN, now=at(100))

    attempts = {a.attempt_id: a.status for a in store.attempts("run-1")}
    assert attempts == {done.attempt_id: "completed", active.attempt_id: "waiting"}
    run = run_row(store)
    assert (run["status"], run["status_detail"], run["finished_at"]) == ("waiting", AMBIGUOUS_DETAIL, ms(100))
    queue = queue_row(store)
    assert (queue["status"], queue["error_code"], queue["finished_at"], queue["updated_at"]) == (
        "parked",
        "effectAmbiguous",
        None,
        ms(100),
    )
    assert text_blob(store, queue["error_hash"]) == AMBIGUOUS_DETAIL
    assert queue["available_at"] == queue_before["available_at"]
    assert_released(store, generation=1)


def test_park_for_ambiguous_effect__emits_event_and_claim_next_skips_it(
    store: Store, claimed: Claimed
) -> None:
    running(store, claimed)
    revision_before = revision(store)
    viewer_before = viewer_revision(store)

    assert store.park_for_ambiguous_effect(run_id="run-1", claim_token=TOKEN, now=at(100))

    assert events(store)[-1] == {
        "revision": revision_before + 1,
        "type": "run.effect_ambiguous",
        "actor_type": "host",
        "actor_id": "host-a",
        "generation": 1,
        "payload": {"status": "waiting", "code": "effectAmbiguous"},
    }
    assert viewer_revision(store) == viewer_before + 2
    before = snapshot(store)
    assert store.claim_next(runner_id="host-b", claim_token="n", lease_ms=LEASE, now=at(LEASE * 5)) is None
    assert snapshot(store) == before


@pytest.mark.parametrize("durable", ["queued", "waiting"])
def test_park_for_ambiguous_effect__raises_when_durable_status_is_not_running(
    store: Store, claimed: Claimed, durable: str
) -> None:
    claimed()
    if durable == "waiting":
        store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(1))
        store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="n", now=at(1))
        store.set_run_status(run_id="run-1", claim_token=TOKEN, status="waiting", now=at(2))
    assert run_row(store)["status"] == durable
    before = snapshot(store)

    with pytest.raises(
        InconsistentState, match=r"^Workflow run run-1 has inconsistent ambiguous-effect state$"
    ):
        store.park_for_ambiguous_effect(run_id="run-1", claim_token=TOKEN, now=at(100))
    assert snapshot(store) == before


@pytest.mark.parametrize("kind", STALE_KINDS)
def test_park_for_ambiguous_effect__stale_token_returns_false_and_writes_nothing(
    store: Store, claimed: Claimed, kind: str
) -> None:
    running(store, claimed)
    token, now = stale_token(store, kind)
    before = snapshot(store)

    assert store.park_for_ambiguous_effect(run_id="run-1", claim_token=token, now=at(now)) is False
    assert snapshot(store) == before


# -- pause_parked ----------------------------------------------------------------------------
def test_pause_parked__pauses_closes_active_time_and_emits_control_event(
    store: Store, claimed: Claimed
) -> None:
    running(store, claimed)
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="ask", now=at(5))
    number = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt.attempt_id, now=at(10))
    assert store.interval_sample(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt.attempt_id,
        interval_number=number,
        elapsed_ms=40,
        now=at(50),
    )
    with store.transaction():
        store.request_open(
            run_id="run-1", claim_token=TOKEN, attempt_id=attempt.attempt_id, kind="q", payload={}, now=at(60)
        )
        assert store.park(run_id="run-1", claim_token=TOKEN, now=at(60))
    open_intervals = "SELECT count(*) FROM attempt_active_intervals WHERE ended_at IS NULL"
    assert rows(store, open_intervals) == [(1,)]
    revision_before = revision(store)
    viewer_before = viewer_revision(store)

    assert store.pause_parked(run_id="run-1", now=at(1000))

    run = run_row(store)
    assert (run["paused"], run["status_detail"], run["status"], run["updated_at"]) == (
        1,
        "paused",
        "waiting",
        ms(1000),
    )
    assert rows(
        store,
        "SELECT interval_number, started_at, observed_at, ended_at, elapsed_ms FROM attempt_active_intervals",
    ) == [(number, ms(10), ms(50), ms(50), 40)]
    assert events(store)[-1] == {
        "revision": revision_before + 1,
        "type": "run.paused",
        "actor_type": "control",
        "actor_id": None,
        "generation": None,
        "payload": {"status": "parked"},
    }
    assert viewer_revision(store) == viewer_before + 2
    assert viewer_targets(store, viewer_before + 2) == STATUS_TARGETS
    assert queue_row(store)["status"] == "parked"
    assert store.is_paused("run-1")


def test_pause_parked__already_paused_returns_true_and_writes_nothing(store: Store, claimed: Claimed) -> None:
    waiting_for_input(store, claimed)
    assert store.pause_parked(run_id="run-1", now=at(100))
    before = snapshot(store)

    assert store.pause_parked(run_id="run-1", now=at(200))

    assert snapshot(store) == before


@pytest.mark.parametrize(
    "branch", ["missing", "queued", "live_claim", "no_request", "durable_completed", "paused_live_claim"]
)
def test_pause_parked__refused_returns_false_and_writes_nothing(
    store: Store, reserve: Reserve, claimed: Claimed, branch: str
) -> None:
    run_id, now = "run-1", 100
    if branch == "missing":
        run_id = "missing"
    elif branch == "queued":
        reserve()
    elif branch in ("live_claim", "paused_live_claim"):
        waiting_for_input(store, claimed)
        if branch == "paused_live_claim":
            assert store.pause_parked(run_id="run-1", now=at(50))
        assert store.claim_for_control(
            run_id="run-1", runner_id="host-c", claim_token="tok-c", lease_ms=LEASE, now=at(60)
        )
        assert queue_row(store)["status"] == "parked"
    elif branch == "no_request":
        running(store, claimed)
        assert store.park(run_id="run-1", claim_token=TOKEN, now=at(50))
    else:
        # The engine finished the run while its request stayed pending: durable status completed.
        waiting_for_input(store, claimed)
        assert store.claim_for_control(
            run_id="run-1", runner_id="host-c", claim_token="tok-c", lease_ms=LEASE, now=at(10)
        )
        store.set_run_status(run_id="run-1", claim_token="tok-c", status="completed", now=at(20))
        assert store.park(run_id="run-1", claim_token="tok-c", now=at(30))
        assert (run_row(store)["status"], queue_row(store)["status"]) == ("completed", "parked")
        assert len(store.requests(run_id="run-1", status="pending")) == 1
    before = snapshot(store)

    assert store.pause_parked(run_id=run_id, now=at(now)) is False
    assert snapshot(store) == before


def test_pause_parked__allowed_once_the_lease_expired(store: Store, claimed: Claimed) -> None:
    waiting_for_input(store, claimed)
    assert store.claim_for_control(
        run_id="run-1", runner_id="host-c", claim_token="tok-c", lease_ms=LEASE, now=at(100)
    )
    assert not store.pause_parked(run_id="run-1", now=at(100 + LEASE - 1))

    assert store.pause_parked(run_id="run-1", now=at(100 + LEASE))
    assert run_row(store)["paused"] == 1


# -- resume_paused_interaction ---------------------------------------------------------------
def test_resume_paused_interaction__unpauses_and_emits_control_event(store: Store, claimed: Claimed) -> None:
    waiting_for_input(store, claimed)
    assert store.pause_parked(run_id="run-1", now=at(100))
    revision_before = revision(store)
    viewer_before = viewer_revision(store)
    queue_before = queue_row(store)

    assert store.resume_paused_interaction(run_id="run-1", now=at(200))

    run = run_row(store)
    assert (run["paused"], run["status"], run["status_detail"], run["updated_at"]) == (
        0,
        "waiting",
        "waiting for origin-session input",
        ms(200),
    )
    assert queue_row(store) == queue_before
    assert events(store)[-1] == {
        "revision": revision_before + 1,
        "type": "run.resumed",
        "actor_type": "control",
        "actor_id": None,
        "generation": None,
        "payload": {"status": "waiting"},
    }
    assert viewer_revision(store) == viewer_before + 2
    assert not store.is_paused("run-1")
    # Resumed, it still waits on its session: claim_next leaves it alone.
    assert store.claim_next(runner_id="host-b", claim_token="n", lease_ms=LEASE, now=at(300)) is None


@pytest.mark.parametrize(
    "branch",
    ["missing", "not_paused", "live_claim", "not_parked", "not_waiting", "no_request", "resumed_twice"],
)
def test_resume_paused_interaction__refused_returns_false_and_writes_nothing(
    store: Store, claimed: Claimed, branch: str
) -> None:
    run_id, now = "run-1", 1000
    if branch == "missing":
        run_id = "missing"
    elif branch == "no_request":
        answered_while_paused(store, claimed)
        store.set_run_status(run_id="run-1", claim_token="tok-v", status="waiting", now=at(50))
        assert store.park(run_id="run-1", claim_token="tok-v", now=at(60))
    else:
        waiting_for_input(store, claimed)
        if branch != "not_paused":
            assert store.pause_parked(run_id="run-1", now=at(10))
        if branch == "live_claim":
            assert store.claim_for_control(
                run_id="run-1", runner_id="host-c", claim_token="tok-c", lease_ms=LEASE, now=at(20)
            )
            now = 30
        elif branch == "not_parked":
            assert store.claim_for_interaction_validation(
                run_id="run-1", runner_id="host-v", claim_token="tok-v", lease_ms=LEASE, now=at(20)
            )
            now = 20 + LEASE
            assert queue_row(store)["status"] == "starting"
        elif branch == "not_waiting":
            assert store.claim_for_control(
                run_id="run-1", runner_id="host-c", claim_token="tok-c", lease_ms=LEASE, now=at(20)
            )
            store.set_run_status(run_id="run-1", claim_token="tok-c", status="running", now=at(30))
            assert store.park(run_id="run-1", claim_token="tok-c", now=at(40))
            assert len(store.requests(run_id="run-1", status="pending")) == 1
        elif branch == "resumed_twice":
            assert store.resume_paused_interaction(run_id="run-1", now=at(20))
    before = snapshot(store)

    assert store.resume_paused_interaction(run_id=run_id, now=at(now)) is False
    assert snapshot(store) == before


# -- request_resume --------------------------------------------------------------------------
def test_request_resume__requeues_run_parked_for_an_operator(store: Store, claimed: Claimed) -> None:
    running(store, claimed)
    assert store.park_for_no_progress(run_id="run-1", claim_token=TOKEN, detail="stuck", now=at(10))
    revision_before = revision(store)
    viewer_before = viewer_revision(store)

    assert store.request_resume(run_id="run-1", now=at(500))

    queue = queue_row(store)
    assert (queue["status"], queue["error_code"], queue["error_hash"]) == ("queued", None, None)
    assert (queue["available_at"], queue["updated_at"], queue["finished_at"]) == (ms(500), ms(500), None)
    run = run_row(store)
    assert (run["status"], run["paused"]) == ("running", 0)
    assert events(store)[-1] == {
        "revision": revision_before + 1,
        "type": "run.resume_requested",
        "actor_type": "control",
        "actor_id": None,
        "generation": None,
        "payload": {"status": "queued"},
    }
    assert viewer_revision(store) == viewer_before + 2
    assert store.claim_next(runner_id="host-b", claim_token="n", lease_ms=LEASE, now=at(499)) is None
    record = store.claim_next(runner_id="host-b", claim_token="n", lease_ms=LEASE, now=at(500))
    assert record is not None and record.run_id == "run-1"


def test_request_resume__clears_paused_flag(store: Store, claimed: Claimed) -> None:
    answered_while_paused(store, claimed)
    assert store.park(run_id="run-1", claim_token="tok-v", now=at(50))
    assert run_row(store)["paused"] == 1

    assert store.request_resume(run_id="run-1", now=at(100))

    assert (run_row(store)["paused"], run_row(store)["status"], queue_row(store)["status"]) == (
        0,
        "running",
        "queued",
    )
    assert not store.is_paused("run-1")


def test_request_resume__allowed_once_the_ambiguous_effect_is_resolved(
    store: Store, claimed: Claimed
) -> None:
    effect_id = ambiguous_effect(store, claimed)
    assert not store.request_resume(run_id="run-1", now=at(100))

    store.effect_resolve(effect_id=effect_id, outcome="applied", now=at(200))

    assert store.request_resume(run_id="run-1", now=at(300))
    queue = queue_row(store)
    assert (queue["status"], queue["error_code"], queue["available_at"]) == ("queued", None, ms(300))


@pytest.mark.parametrize(
    "branch",
    ["missing", "done", "failed", "live_claim", "pending_request", "ambiguous_effect", "session_taken"],
)
def test_request_resume__refused_returns_false_and_writes_nothing(
    store: Store, reserve: Reserve, claimed: Claimed, branch: str
) -> None:
    run_id, now = "run-1", 1000
    if branch == "missing":
        run_id = "missing"
    elif branch == "done":
        claimed()
        assert store.complete(run_id="run-1", claim_token=TOKEN, now=at(10))
    elif branch == "failed":
        reserve()
        assert store.fail(run_id="run-1", error_code="boom", error_message="broken", now=at(10))
    elif branch == "live_claim":
        claimed()
        now = LEASE - 1
    elif branch == "pending_request":
        waiting_for_input(store, claimed)
    elif branch == "ambiguous_effect":
        ambiguous_effect(store, claimed)
        assert [e.status for e in store.effects(run_id="run-1")] == ["ambiguous"]
    else:
        # run-1 is parked; a newer run took its session's one active slot.
        claimed()
        assert store.park(run_id="run-1", claim_token=TOKEN, now=at(10))
        reserve("run-2", now=at(20))
    before = snapshot(store)

    assert store.request_resume(run_id=run_id, now=at(now)) is False
    assert snapshot(store) == before


def test_request_resume__allowed_once_the_lease_expired(store: Store, claimed: Claimed) -> None:
    claimed()

    assert store.request_resume(run_id="run-1", now=at(LEASE))

    assert queue_row(store)["status"] == "queued"


def test_request_resume__headless_run_ignores_session_slot(
    store: Store, reserve: Reserve, claimed: Claimed
) -> None:
    claimed("run-1", execution_mode="headless")
    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(10))
    reserve("run-2", now=at(20))

    assert store.request_resume(run_id="run-1", now=at(30))

    assert queue_row(store)["status"] == "queued"


# -- is_paused -------------------------------------------------------------------------------
def test_is_paused__follows_the_paused_flag(store: Store, reserve: Reserve, claimed: Claimed) -> None:
    assert not store.is_paused("missing")
    waiting_for_input(store, claimed)
    assert not store.is_paused("run-1")

    assert store.pause_parked(run_id="run-1", now=at(10))
    assert store.is_paused("run-1")

    assert store.resume_paused_interaction(run_id="run-1", now=at(20))
    assert not store.is_paused("run-1")


# -- run_status and the run row a transaction read -------------------------------------------
def test_run_status__the_durable_status_or_none(store: Store, claimed: Claimed) -> None:
    assert store.run_status("missing") is None
    with pytest.raises(InvalidInput):
        store.run_status("")
    claimed("run-1")
    store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="running", now=at(1))
    assert store.run_status("run-1") == "running"


def test_run_row__read_again_only_after_a_write_of_the_transaction(
    store: Store, claimed: Claimed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calls in one transaction share the run row it read until the transaction writes; the
    next call after a write sees that write (a move of the durable status keeps the row, with
    the status it wrote)."""
    claimed("run-1")
    reads: list[str] = []
    each = store.db.each

    def counted(calls: Any, /) -> Any:
        reads.extend(params["run_id"] for name, params in calls if name == "run_row")
        return each(calls)

    monkeypatch.setattr(store.db, "each", counted)
    with store.transaction():
        assert store.run_status("run-1") == "queued"
        assert store.run_status("run-1") == "queued"
        assert not store.is_paused("run-1")
        assert reads == ["run-1"]
        store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="running", now=at(1))
        assert store.run_status("run-1") == "running"
        assert store.run_status("run-2") is None
        assert store.run_status("run-2") is None
        # set_run_status's own check read nothing, nor the read after it (the move kept the
        # row it wrote); a run that is not there is read each time.
        assert reads == ["run-1", "run-2", "run-2"]
        store.db.queue("viewer_revision_prune", run_id="run-1", retained=1)  # any write, even queued
        assert store.run_status("run-1") == "running"
        assert reads == ["run-1", "run-2", "run-2", "run-1"]
    assert store.run_status("run-1") == "running"


def test_run_row__after_attempt_finish_is_the_row_as_read_with_its_revision_one_up(
    store: Store, claimed: Claimed, monkeypatch: pytest.MonkeyPatch
) -> None:
    """attempt_finish's writes change nothing of the run row but the revision (its journal entry):
    the next call in its transaction reads no row, and the row it uses is the stored one."""
    claimed("run-1")
    store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="running", now=at(1))
    attempt = store.attempt_start(run_id="run-1", claim_token="tok-run-1", node_id="a", now=at(1))
    reads: list[str] = []
    each = store.db.each

    def counted(calls: Any, /) -> Any:
        reads.extend(params["run_id"] for name, params in calls if name == "run_row")
        return each(calls)

    monkeypatch.setattr(store.db, "each", counted)
    with store.transaction():
        store.attempt_finish(
            run_id="run-1",
            claim_token="tok-run-1",
            attempt_id=attempt.attempt_id,
            status="completed",
            output={"n": 1},
            now=at(2),
        )
        assert reads == ["run-1"]
        assert store.run_status("run-1") == "running"
        assert reads == ["run-1"]
        kept = store._row("run-1")
        stored = store.db.one("run_row", run_id="run-1")
        assert kept is not None and stored is not None
        columns = stored.keys()  # (iterating a sqlite3.Row gives its values)
        assert {k: kept[k] for k in columns} == {k: stored[k] for k in columns}
        reads.clear()
        store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="completed", now=at(2))
        assert store.run_status("run-1") == "completed"
        assert reads == []
        kept = store._row("run-1")
        stored = store.db.one("run_row", run_id="run-1")
        assert kept is not None and stored is not None
        assert {k: kept[k] for k in columns} == {k: stored[k] for k in columns}
    assert store.run_status("run-1") == "completed"


def test_run_row__after_mark_running_and_status_moves_is_the_stored_row(
    store: Store, claimed: Claimed
) -> None:
    """mark_running and a move of the durable status keep the row the transaction reads next (its
    statuses, times and revision) equal to what is stored, also for a move with no journal entry
    of its own."""
    claimed("run-1", running=False)
    with store.transaction():
        assert store.mark_running(run_id="run-1", claim_token="tok-run-1", now=at(1))
        kept = store._row("run-1")
        stored = store.db.one("run_row", run_id="run-1")
        assert kept is not None and stored is not None
        columns = stored.keys()
        assert {k: kept[k] for k in columns} == {k: stored[k] for k in columns}
        store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="running", now=at(1))
        kept = store._row("run-1")
        stored = store.db.one("run_row", run_id="run-1")
        assert kept is not None and stored is not None
        assert {k: kept[k] for k in columns} == {k: stored[k] for k in columns}
        store.set_run_status(run_id="run-1", claim_token="tok-run-1", status="waiting", now=at(2))
        kept = store._row("run-1")
        stored = store.db.one("run_row", run_id="run-1")
        assert kept is not None and stored is not None
        assert {k: kept[k] for k in columns} == {k: stored[k] for k in columns}


# -- SPEC §9 invariant 2: a stale claimer cannot write ---------------------------------------
Ids = dict[str, str]
#: Every claim-gated call, and how it refuses a stale claim: ``False`` or ``ClaimLost``.
GATED: dict[str, tuple[str, Callable[[Store, str, Any, Ids], Any]]] = {
    "renew": (
        "false",
        lambda s, t, now, ids: s.renew(run_id="run-1", claim_token=t, lease_ms=LEASE, now=now),
    ),
    "mark_running": ("false", lambda s, t, now, ids: s.mark_running(run_id="run-1", claim_token=t, now=now)),
    "park": ("false", lambda s, t, now, ids: s.park(run_id="run-1", claim_token=t, now=now)),
    "complete": ("false", lambda s, t, now, ids: s.complete(run_id="run-1", claim_token=t, now=now)),
    "park_until": (
        "false",
        lambda s, t, now, ids: s.park_until(
            run_id="run-1", claim_token=t, available_at=at(LEASE * 9), now=now
        ),
    ),
    "park_for_no_progress": (
        "false",
        lambda s, t, now, ids: s.park_for_no_progress(run_id="run-1", claim_token=t, detail="d", now=now),
    ),
    "park_for_source_change": (
        "false",
        lambda s, t, now, ids: s.park_for_source_change(run_id="run-1", claim_token=t, detail="d", now=now),
    ),
    "park_for_ambiguous_effect": (
        "false",
        lambda s, t, now, ids: s.park_for_ambiguous_effect(run_id="run-1", claim_token=t, now=now),
    ),
    "fail": (
        "false",
        lambda s, t, now, ids: s.fail(
            run_id="run-1", claim_token=t, error_code="e", error_message="m", now=now
        ),
    ),
    "cancel": ("false", lambda s, t, now, ids: s.cancel(run_id="run-1", claim_token=t, now=now)),
    "delete": ("false", lambda s, t, now, ids: s.delete(run_id="run-1", claim_token=t, now=now)),
    "begin_interaction_timeout": (
        "false",
        lambda s, t, now, ids: s.begin_interaction_timeout(
            run_id="run-1", target_session_id="session-1", claim_token=t, now=now
        ),
    ),
    "set_run_status": (
        "lost",
        lambda s, t, now, ids: s.set_run_status(run_id="run-1", claim_token=t, status="waiting", now=now),
    ),
    "attempt_start": (
        "lost",
        lambda s, t, now, ids: s.attempt_start(run_id="run-1", claim_token=t, node_id="next", now=now),
    ),
    "attempt_finish": (
        "lost",
        lambda s, t, now, ids: s.attempt_finish(
            run_id="run-1", claim_token=t, attempt_id=ids["attempt"], status="completed", output=1, now=now
        ),
    ),
    "attempt_interrupt_active": (
        "lost",
        lambda s, t, now, ids: s.attempt_interrupt_active(run_id="run-1", claim_token=t, now=now),
    ),
    "interval_open": (
        "lost",
        lambda s, t, now, ids: s.interval_open(
            run_id="run-1", claim_token=t, attempt_id=ids["attempt"], now=now
        ),
    ),
    "interval_sample": (
        "lost",
        lambda s, t, now, ids: s.interval_sample(
            run_id="run-1",
            claim_token=t,
            attempt_id=ids["attempt"],
            interval_number=1,
            elapsed_ms=99,
            now=now,
        ),
    ),
    "interval_close": (
        "lost",
        lambda s, t, now, ids: s.interval_close(
            run_id="run-1", claim_token=t, attempt_id=ids["attempt"], interval_number=1, now=now
        ),
    ),
    "close_run_time": (
        "lost",
        lambda s, t, now, ids: s.close_run_time(run_id="run-1", claim_token=t, now=now),
    ),
    "request_open": (
        "lost",
        lambda s, t, now, ids: s.request_open(
            run_id="run-1", claim_token=t, attempt_id=ids["attempt"], kind="q", payload={}, now=now
        ),
    ),
    "submission_resolve": (
        "lost",
        lambda s, t, now, ids: s.submission_resolve(
            run_id="run-1", claim_token=t, submission_id="submission-none", accepted=True, now=now
        ),
    ),
    "decision_open": (
        "lost",
        lambda s, t, now, ids: s.decision_open(
            run_id="run-1", claim_token=t, node_id="n", request={}, now=now
        ),
    ),
    "effect_enqueue": (
        "lost",
        lambda s, t, now, ids: s.effect_enqueue(
            run_id="run-1", claim_token=t, effect_type="run.park_queue", idempotency_key="k2", now=now
        ),
    ),
    "effect_begin": (
        "lost",
        lambda s, t, now, ids: s.effect_begin(
            run_id="run-1", claim_token=t, effect_id=ids["effect"], now=now
        ),
    ),
    "effect_finish": (
        "lost",
        lambda s, t, now, ids: s.effect_finish(
            run_id="run-1", claim_token=t, effect_id=ids["effect"], applied=True, now=now
        ),
    ),
    "effect_mark_ambiguous": (
        "lost",
        lambda s, t, now, ids: s.effect_mark_ambiguous(
            run_id="run-1", claim_token=t, effect_id=ids["effect"], now=now
        ),
    ),
    "message_send": (
        "lost",
        lambda s, t, now, ids: s.message_send(
            run_id="run-1", claim_token=t, kind="step", payload={}, now=now
        ),
    ),
}


@pytest.mark.parametrize("kind", ["wrong", "expired", "superseded"])
@pytest.mark.parametrize("call", list(GATED))
def test_invariant__stale_claimer_cannot_write(store: Store, claimed: Claimed, call: str, kind: str) -> None:
    running(store, claimed)
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="n", now=at(1))
    store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt.attempt_id, now=at(1))
    effect = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="run.park_queue", idempotency_key="k1", now=at(1)
    )
    ids = {"attempt": attempt.attempt_id, "effect": effect.effect_id}
    token, now = stale_token(store, kind)
    refusal, method = GATED[call]
    before = snapshot(store)

    if refusal == "false":
        assert method(store, token, at(now), ids) is False
    else:
        with pytest.raises(ClaimLost, match="run-1"):
            method(store, token, at(now), ids)
    assert snapshot(store) == before


def test_invariant__stale_claimer_cannot_cancel_through_the_stale_fallback(
    store: Store, claimed: Claimed
) -> None:
    # A wrong token never falls back to the tokenless stale cancel, even once the lease expired.
    claimed()
    before = snapshot(store)

    assert store.cancel(run_id="run-1", claim_token="tok-wrong", now=at(LEASE * 2)) is False
    assert snapshot(store) == before


def test_invariant__the_current_holder_still_writes_after_a_stale_refusal(
    store: Store, claimed: Claimed
) -> None:
    claimed()
    assert store.claim(run_id="run-1", runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(LEASE))
    assert not store.park(run_id="run-1", claim_token=TOKEN, now=at(LEASE + 1))

    assert store.park(run_id="run-1", claim_token="tok-b", now=at(LEASE + 2))

    assert_released(store, generation=2)


# -- status writes that need no answer ---------------------------------------------------------
@pytest.mark.parametrize("where", ["the next statement", "the commit"])
def test_expect__a_write_that_changes_no_row_fails_the_transaction_and_writes_nothing(
    store: Store, reserve: Reserve, where: str
) -> None:
    # A write sent with expect may go out only with a later statement or the commit (PostgreSQL):
    # whichever carries it, a count other than one row fails the whole transaction.
    reserve()
    resource_id = store.db.one("run_row", run_id="run-1")["resource_id"]
    before = snapshot(store)
    with pytest.raises(InconsistentState, match=r"^the lease moved$"), store.transaction():
        store.record_event(run_id="run-1", workflow_ref="wf", type="note.a", now=at(1))
        store.db.expect(
            "lease_release",
            "the lease moved",
            resource_id=resource_id,
            token_hash=token_hash("tok-nobody"),
            generation=0,
            now=ms(1),
        )
        if where == "the next statement":
            store.get_run("run-1")
            raise AssertionError("the statement that carried the failed write succeeded")
    assert snapshot(store) == before
    assert store.record_event(run_id="run-1", workflow_ref="wf", type="note.b").type == "note.b"


def test_expect__a_write_that_changes_its_one_row_lands_with_the_transaction(
    store: Store, claimed: Claimed
) -> None:
    claimed()
    with store.transaction():
        row = store.db.one("run_row", run_id="run-1")
        store.db.expect(
            "lease_release",
            "the lease moved",
            resource_id=row["resource_id"],
            token_hash=token_hash(TOKEN),
            generation=row["generation"],
            now=ms(1),
        )
    assert_released(store, generation=1)


def test_status_moves__a_held_row_that_went_stale_fails_the_whole_transaction(
    store: Store, claimed: Claimed
) -> None:
    # A queue move decided on the run's row trusts that row only as far as the database confirms
    # it: had the status changed since the row was read (a store bug), the move changes no row,
    # and the whole transaction fails instead of going on as if it had moved.
    claimed(running=False)
    before = snapshot(store)
    stale = "run-1 queue status changed from starting"
    with pytest.raises(InconsistentState, match=stale), store.transaction():
        held = store._row("run-1")
        assert held is not None and held["status"] == "starting"
        store.db.run(
            "queue_set_status",
            run_id="run-1",
            status="done",
            now=ms(1),
            clear_error=0,
            stamp_start=0,
            sources=json.dumps(["starting"]),
        )
        assert store._set_queue(held, QueueStatus.RUNNING, ms(1)) is True
    assert snapshot(store) == before


def test_status_moves__a_held_durable_status_that_went_stale_fails_the_whole_transaction(
    store: Store, claimed: Claimed
) -> None:
    # The same for the durable status: set_run_status checks the move against the row it holds
    # and sends it without waiting; had the status changed since, the transaction fails.
    running(store, claimed)
    before = snapshot(store)
    stale = "run-1 durable status changed from running"
    with pytest.raises(InconsistentState, match=stale), store.transaction():
        held = store._row("run-1")
        assert held is not None and held["run_status"] == "running"
        store.db.run(
            "run_set_status",
            run_id="run-1",
            status="completed",
            detail=None,
            error_hash=None,
            now=ms(1),
            sources=json.dumps(["running"]),
        )
        store._move_run(held, RunStatus.WAITING, ms(1))
    assert snapshot(store) == before


def test_status_moves__the_held_row_refuses_an_illegal_move_without_writing(
    store: Store, claimed: Claimed
) -> None:
    claimed()
    assert store.complete(run_id="run-1", claim_token=TOKEN, now=at(1))
    before = snapshot(store)
    with store.transaction():
        held = store._row("run-1")
        assert held is not None and held["status"] == "done"
        assert store._set_queue(held, QueueStatus.RUNNING, ms(2)) is False
    assert snapshot(store) == before
