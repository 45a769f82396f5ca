"""Terminal transitions: fail, cancel, cancel_stale and delete (SPEC §3.1, §3.2, §6, §9, §11 items 58-68).

Invariants 5 (terminal queue statuses are absorbing) and 10 (fail/cancel release the lease and settle
the run's dependents) and departure 8 (a durable terminal status is never overwritten) live here too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from tether.errors import Conflict
from tether.store import RunRecord, Store
from tether.values import token_hash

from .conftest import LEASE, at, execute, rows, snapshot
from .readers import T0_MS, ms, text, viewer_deltas

TOKEN = "tok-run-1"
CANCELLED_TEXT = "Workflow run cancelled"


# -- reading stored rows -----------------------------------------------------------------------


def blob_json(store: Store, digest: bytes | None) -> Any:
    stored = text(store, digest)
    return None if stored is None else json.loads(stored)


def queue_row(store: Store, run_id: str = "run-1") -> dict[str, Any]:
    (row,) = rows(
        store,
        "SELECT status, error_code, error_hash, updated_at, started_at, finished_at, available_at "
        "FROM run_queue WHERE run_id = ?",
        run_id,
    )
    keys = ("status", "error_code", "error_hash", "updated_at", "started_at", "finished_at", "available_at")
    found = dict(zip(keys, row, strict=True))
    found["error"] = text(store, found.pop("error_hash"))
    return found


def run_row(store: Store, run_id: str = "run-1") -> dict[str, Any]:
    (row,) = rows(
        store,
        "SELECT status, paused, status_detail, error_hash, finished_at FROM runs WHERE run_id = ?",
        run_id,
    )
    found = dict(zip(("status", "paused", "status_detail", "error_hash", "finished_at"), row, strict=True))
    found["error"] = text(store, found.pop("error_hash"))
    return found


def lease_row(store: Store, run_id: str = "run-1") -> dict[str, Any]:
    (row,) = rows(
        store,
        "SELECT l.generation, l.owner_type, l.owner_id, l.token_hash, l.acquired_at, l.heartbeat_at, "
        "l.expires_at FROM leases l JOIN runs r ON r.resource_id = l.resource_id WHERE r.run_id = ?",
        run_id,
    )
    keys = ("generation", "owner_type", "owner_id", "token_hash", "acquired_at", "heartbeat_at", "expires_at")
    return dict(zip(keys, row, strict=True))


def run_events(store: Store, run_id: str = "run-1") -> list[dict[str, Any]]:
    found = rows(
        store,
        "SELECT e.event_seq, e.resource_revision, e.event_type, e.actor_type, e.actor_id, "
        "e.lease_generation, COALESCE(e.payload, CAST(b.content AS TEXT)), e.recorded_at "
        "FROM events e JOIN runs r ON r.resource_id = e.resource_id "
        "LEFT JOIN blobs b ON b.blob_hash = e.payload_hash WHERE r.run_id = ? ORDER BY e.event_seq",
        run_id,
    )
    keys = ("seq", "revision", "type", "actor_type", "actor_id", "generation", "payload", "recorded_at")
    events = [dict(zip(keys, row, strict=True)) for row in found]
    for event in events:
        event["payload"] = json.loads(event["payload"])
    return events


def last_event(store: Store, run_id: str = "run-1") -> dict[str, Any]:
    return run_events(store, run_id)[-1]


def run_revision(store: Store, run_id: str = "run-1") -> int:
    (row,) = rows(
        store,
        "SELECT res.revision FROM resources res JOIN runs r ON r.resource_id = res.resource_id "
        "WHERE r.run_id = ?",
        run_id,
    )
    return int(row[0])


def effect_row(store: Store, effect_id: str) -> dict[str, Any]:
    (row,) = rows(
        store,
        "SELECT e.status, e.attempt_count, e.next_attempt_at, e.error_hash, e.updated_at, e.settled_at, "
        "res.revision, e.resource_id FROM effects e JOIN resources res ON res.resource_id = e.resource_id "
        "WHERE e.effect_id = ?",
        effect_id,
    )
    keys = (
        "status",
        "attempt_count",
        "next_attempt_at",
        "error_hash",
        "updated_at",
        "settled_at",
        "revision",
        "resource_id",
    )
    found = dict(zip(keys, row, strict=True))
    found["error"] = text(store, found.pop("error_hash"))
    return found


def resource_events(store: Store, resource_id: str) -> list[tuple[Any, ...]]:
    found = rows(
        store,
        "SELECT e.resource_revision, e.event_type, e.actor_type, e.actor_id, e.lease_generation, "
        "COALESCE(e.payload, CAST(b.content AS TEXT)) FROM events e "
        "LEFT JOIN blobs b ON b.blob_hash = e.payload_hash "
        "WHERE e.resource_id = ? ORDER BY e.event_seq",
        resource_id,
    )
    return [(*row[:5], json.loads(row[5])) for row in found]


def attempt_rows(store: Store, run_id: str = "run-1") -> dict[str, dict[str, Any]]:
    found = rows(
        store,
        "SELECT attempt_id, status, error_hash, finished_at FROM node_attempts WHERE run_id = ?",
        run_id,
    )
    return {
        attempt_id: {"status": status, "error": text(store, error_hash), "finished_at": finished_at}
        for attempt_id, status, error_hash, finished_at in found
    }


def open_intervals(store: Store, run_id: str = "run-1") -> int:
    (row,) = rows(
        store,
        "SELECT count(*) FROM attempt_active_intervals t JOIN node_attempts a "
        "ON a.attempt_id = t.attempt_id WHERE a.run_id = ? AND t.ended_at IS NULL",
        run_id,
    )
    return int(row[0])


def message_statuses(store: Store, run_id: str = "run-1") -> dict[str, str]:
    return {m.message_id: m.status for m in store.messages(run_id=run_id, status=None)}


def write(store: Store, sql: str, *params: Any) -> None:
    """Put the database into a state no public call reaches (used to reach a guarded branch)."""
    execute(store, sql, *params)


# -- building runs -----------------------------------------------------------------------------


def start_attempt(store: Store, *, now: int = 10, node_id: str = "node-a", **kw: Any) -> str:
    return store.attempt_start(
        run_id="run-1", claim_token=TOKEN, node_id=node_id, now=at(now), **kw
    ).attempt_id


def waiting_run(store: Store, claimed: Callable[..., RunRecord], *, park: bool = True) -> tuple[str, str]:
    """A run whose attempt asks its session for input; parked unless ``park`` is False."""
    claimed()
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(5))
    attempt_id = start_attempt(store, timeout_ms=1000)
    with store.transaction():
        request = store.request_open(
            run_id="run-1", claim_token=TOKEN, attempt_id=attempt_id, kind="ask", payload={"q": 1}, now=at(20)
        )
        if park:
            assert store.park(run_id="run-1", claim_token=TOKEN, now=at(20))
    return attempt_id, request.request_id


def send_all_kinds(store: Store) -> dict[str, str]:
    sent = {}
    for kind in ("step", "decision", "notification", "terminal", "followUp"):
        message = store.message_send(
            run_id="run-1", claim_token=TOKEN, kind=kind, payload={"k": kind}, now=at(30)
        )
        assert message is not None
        sent[kind] = message.message_id
    return sent


# -- fail with a token -------------------------------------------------------------------------


def test_fail__with_token_finishes_the_queue_and_run_rows(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    assert store.fail(
        run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="it broke", now=at(500)
    )
    assert queue_row(store) == {
        "status": "failed",
        "error_code": "boom",
        "error": "it broke",
        "updated_at": ms(500),
        "started_at": ms(0),
        "finished_at": ms(500),
        "available_at": ms(0),
    }
    assert run_row(store) == {
        "status": "failed",
        "paused": 0,
        "status_detail": None,
        "error": "it broke",
        "finished_at": ms(500),
    }
    record = store.get_run("run-1")
    assert record is not None
    assert (record.status, record.error_code, record.error_message) == ("failed", "boom", "it broke")
    assert (record.runner_id, record.claim_generation, record.claim_expires_at) == (None, None, None)


def test_fail__releases_the_lease_and_keeps_its_generation(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    assert store.fail(run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="x", now=at(500))
    assert lease_row(store) == {
        "generation": 1,
        "owner_type": None,
        "owner_id": None,
        "token_hash": None,
        "acquired_at": None,
        "heartbeat_at": None,
        "expires_at": None,
    }
    assert not store.verify_claim(run_id="run-1", claim_token=TOKEN, now=at(501))


def test_fail__event_is_run_queue_failed_by_the_owner(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    revision = run_revision(store)
    assert store.fail(run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="x", now=at(500))
    event = last_event(store)
    assert event["type"] == "run.queue_failed"
    assert (event["actor_type"], event["actor_id"], event["generation"]) == ("host", "host-a", 1)
    assert event["revision"] == revision + 1 == run_revision(store)
    assert event["recorded_at"] == ms(500)


def test_fail__event_payload_carries_the_full_untruncated_message(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    message = "é" + "x" * 20_000 + "\n" + "end"
    assert store.fail(
        run_id="run-1", claim_token=TOKEN, error_code="tooLong", error_message=message, now=at(5)
    )
    assert last_event(store)["payload"] == {"status": "failed", "code": "tooLong", "error": message}
    assert queue_row(store)["error"] == message
    assert run_row(store)["error"] == message
    record = store.get_run("run-1")
    assert record is not None and record.error_message == message


def test_fail__fails_active_attempts_and_closes_their_time(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    done = start_attempt(store, now=10, node_id="node-a")
    store.attempt_finish(run_id="run-1", claim_token=TOKEN, attempt_id=done, status="completed", now=at(20))
    active = start_attempt(store, now=30, node_id="node-b")
    number = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=active, now=at(30))
    store.interval_sample(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=active,
        interval_number=number,
        elapsed_ms=40,
        now=at(70),
    )
    assert store.fail(
        run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="broke", now=at(500)
    )
    assert attempt_rows(store) == {
        done: {"status": "completed", "error": None, "finished_at": ms(20)},
        active: {"status": "failed", "error": "broke", "finished_at": ms(500)},
    }
    assert rows(store, "SELECT ended_at, elapsed_ms FROM attempt_active_intervals") == [(ms(70), 40)]


def test_fail__keeps_the_error_and_finish_time_of_an_interrupted_attempt(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    attempt = start_attempt(store, now=10)
    store.attempt_finish(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt,
        status="interrupted",
        error_message="lost",
        now=at(20),
    )
    assert store.fail(
        run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="broke", now=at(500)
    )
    assert attempt_rows(store) == {attempt: {"status": "failed", "error": "lost", "finished_at": ms(20)}}


def test_fail__cancels_pending_requests(store: Store, claimed: Callable[..., RunRecord]) -> None:
    _, request_id = waiting_run(store, claimed, park=False)
    assert store.fail(run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="x", now=at(500))
    assert rows(
        store,
        "SELECT status, revision, updated_at FROM interactive_requests WHERE request_id = ?",
        request_id,
    ) == [("cancelled", 2, ms(500))]


def test_fail__cancels_pending_step_decision_and_follow_up_messages_only(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    sent = send_all_kinds(store)
    acked = store.message_send(
        run_id="run-1", claim_token=TOKEN, kind="step", payload={"acked": True}, now=at(31)
    )
    assert acked is not None
    assert store.message_ack(session_id="session-1", message_id=acked.message_id, now=at(32))
    assert store.fail(run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="x", now=at(500))
    assert message_statuses(store) == {
        sent["step"]: "cancelled",
        sent["decision"]: "cancelled",
        sent["followUp"]: "cancelled",
        sent["notification"]: "pending",
        sent["terminal"]: "pending",
        acked.message_id: "sent",
    }
    cancelled = rows(store, "SELECT updated_at FROM workflow_messages WHERE status = 'cancelled'")
    assert cancelled == [(ms(500),)] * 3


def test_fail__records_two_viewer_revisions(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    (before,) = rows(store, "SELECT presentation_revision FROM viewer_runs WHERE run_id = 'run-1'")[0]
    assert store.fail(run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="x", now=at(500))
    (after,) = rows(store, "SELECT presentation_revision FROM viewer_runs WHERE run_id = 'run-1'")[0]
    assert after == before + 2
    last = [(d[2], d[3]) for d in viewer_deltas(store, "run-1") if d[1] == after]
    assert last == [("summary", ""), ("replay", "")]


@pytest.mark.parametrize(
    ("token", "now"),
    [
        pytest.param("tok-wrong", 100, id="wrong-token"),
        pytest.param(TOKEN, LEASE, id="expired-at-exact-expiry"),
        pytest.param(TOKEN, LEASE + 5_000, id="expired-later"),
    ],
)
def test_fail__refuses_a_stale_token_and_writes_nothing(
    store: Store, claimed: Callable[..., RunRecord], token: str, now: int
) -> None:
    claimed()
    before = snapshot(store)
    assert not store.fail(
        run_id="run-1", claim_token=token, error_code="boom", error_message="x", now=at(now)
    )
    assert snapshot(store) == before


def test_fail__refuses_a_superseded_token(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    assert store.claim(run_id="run-1", runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(LEASE))
    before = snapshot(store)
    assert not store.fail(
        run_id="run-1", claim_token=TOKEN, error_code="boom", error_message="x", now=at(LEASE + 1)
    )
    assert snapshot(store) == before


def test_fail__refuses_a_missing_run(store: Store) -> None:
    before = snapshot(store)
    assert not store.fail(run_id="nope", error_code="boom", error_message="x", now=at(0))
    assert not store.fail(run_id="nope", claim_token="t", error_code="boom", error_message="x", now=at(0))
    assert snapshot(store) == before


# -- tokenless fail ----------------------------------------------------------------------------


def test_fail__tokenless_fails_a_queued_unowned_run(store: Store, reserve: Callable[..., RunRecord]) -> None:
    reserve()
    assert store.fail(run_id="run-1", error_code="invalidInput", error_message="bad input", now=at(100))
    assert queue_row(store)["status"] == "failed"
    assert run_row(store)["status"] == "failed"
    event = last_event(store)
    assert event["type"] == "run.queue_failed"
    assert (event["actor_type"], event["actor_id"], event["generation"]) == ("system", None, None)
    assert event["payload"] == {"status": "failed", "code": "invalidInput", "error": "bad input"}
    assert lease_row(store)["generation"] == 0


def test_fail__tokenless_fails_a_starting_run_with_no_owner(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed(running=False)
    write(
        store,
        "UPDATE leases SET owner_type = NULL, owner_id = NULL, token_hash = NULL, acquired_at = NULL, "
        "heartbeat_at = NULL, expires_at = NULL",
    )
    assert queue_row(store)["status"] == "starting"
    assert store.fail(run_id="run-1", error_code="boom", error_message="x", now=at(100))
    assert queue_row(store)["status"] == "failed"
    assert last_event(store)["generation"] == 1


@pytest.mark.parametrize(
    "state",
    ["starting-live", "starting-expired", "running-live", "running-expired", "parked"],
)
def test_fail__tokenless_refuses_owned_running_or_parked_runs(
    store: Store, claimed: Callable[..., RunRecord], state: str
) -> None:
    claimed(running=state.startswith("running"))
    if state == "parked":
        assert store.park(run_id="run-1", claim_token=TOKEN, now=at(10))
    now = LEASE + 1 if state.endswith("expired") else 100
    before = snapshot(store)
    assert not store.fail(run_id="run-1", error_code="boom", error_message="x", now=at(now))
    assert snapshot(store) == before


# -- cancel with a token -----------------------------------------------------------------------


def test_cancel__with_token_cancels_the_queue_and_run_rows(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(500))
    queue = queue_row(store)
    assert (queue["status"], queue["error_code"], queue["error"], queue["finished_at"]) == (
        "cancelled",
        "cancelled",
        CANCELLED_TEXT,
        ms(500),
    )
    assert run_row(store) == {
        "status": "cancelled",
        "paused": 0,
        "status_detail": None,
        "error": CANCELLED_TEXT,
        "finished_at": ms(500),
    }
    lease = lease_row(store)
    assert (lease["generation"], lease["owner_id"], lease["token_hash"]) == (1, None, None)
    event = last_event(store)
    assert event["type"] == "run.queue_cancelled"
    assert (event["actor_type"], event["actor_id"], event["generation"]) == ("host", "host-a", 1)
    assert event["payload"] == {"status": "cancelled", "code": "cancelled", "error": CANCELLED_TEXT}


def test_cancel__cancels_active_attempts_and_closes_their_time(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    attempt = start_attempt(store, now=10)
    number = store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(10))
    store.interval_sample(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt,
        interval_number=number,
        elapsed_ms=25,
        now=at(35),
    )
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(500))
    assert attempt_rows(store) == {
        attempt: {"status": "cancelled", "error": CANCELLED_TEXT, "finished_at": ms(500)}
    }
    assert open_intervals(store) == 0
    assert rows(store, "SELECT ended_at, elapsed_ms FROM attempt_active_intervals") == [(ms(35), 25)]


def test_cancel__cancels_pending_effects_with_an_event_on_the_effect_resource(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    effect = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="mail.send", idempotency_key="k1", now=at(10)
    )
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(500))
    stored = effect_row(store, effect.effect_id)
    assert {k: v for k, v in stored.items() if k != "resource_id"} == {
        "status": "cancelled",
        "attempt_count": 0,
        "next_attempt_at": None,
        "error": CANCELLED_TEXT,
        "updated_at": ms(500),
        "settled_at": ms(500),
        "revision": 2,
    }
    assert resource_events(store, stored["resource_id"])[-1] == (
        2,
        "effect.cancelled",
        "control",
        "host-a",
        None,
        {"runId": "run-1", "effectId": effect.effect_id, "reason": "workflowCancelled"},
    )
    assert rows(store, "SELECT count(*) FROM effect_attempts") == [(0,)]


def test_cancel__marks_applying_effect_ambiguous_and_interrupts_its_attempt(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    effect = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="mail.send", idempotency_key="k1", now=at(10)
    )
    store.effect_begin(run_id="run-1", claim_token=TOKEN, effect_id=effect.effect_id, now=at(20))
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(500))
    stored = effect_row(store, effect.effect_id)
    assert (stored["status"], stored["attempt_count"], stored["error"], stored["settled_at"]) == (
        "ambiguous",
        1,
        CANCELLED_TEXT,
        ms(500),
    )
    assert stored["revision"] == 3
    assert resource_events(store, stored["resource_id"])[-1] == (
        3,
        "effect.ambiguous",
        "control",
        "host-a",
        None,
        {"runId": "run-1", "effectId": effect.effect_id, "reason": "workflowCancelled"},
    )
    (attempt,) = rows(
        store,
        "SELECT attempt_number, finished_at, outcome, error_hash FROM effect_attempts WHERE effect_id = ?",
        effect.effect_id,
    )
    assert attempt[:3] == (1, ms(500), "interrupted")
    assert text(store, attempt[3]) == CANCELLED_TEXT


def test_cancel__leaves_settled_and_non_run_scoped_effects_alone(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    applied = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="mail.send", idempotency_key="k1", now=at(10)
    )
    store.effect_begin(run_id="run-1", claim_token=TOKEN, effect_id=applied.effect_id, now=at(11))
    store.effect_finish(
        run_id="run-1",
        claim_token=TOKEN,
        effect_id=applied.effect_id,
        applied=True,
        result={"ok": 1},
        now=at(12),
    )
    hosted = store.effect_enqueue(
        run_id="run-1",
        claim_token=TOKEN,
        effect_type="mail.send",
        idempotency_key="k2",
        owner_scope="host",
        now=at(13),
    )
    before = {e: effect_row(store, e) for e in (applied.effect_id, hosted.effect_id)}
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(500))
    assert {e: effect_row(store, e) for e in before} == before


def test_cancel__resolves_only_unresolved_decisions(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    answered = store.decision_open(
        run_id="run-1", claim_token=TOKEN, node_id="n1", request={"q": 1}, now=at(10)
    )
    open_one = store.decision_open(
        run_id="run-1", claim_token=TOKEN, node_id="n2", request={"q": 2}, now=at(11)
    )
    resolved = store.decision_resolve(
        decision_id=answered.decision_id,
        outcome="accepted",
        provenance="human",
        response={"yes": True},
        actor_id="alice",
        now=at(12),
    )
    assert resolved is not None
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(500))
    stored = {
        r[0]: r[1:]
        for r in rows(
            store,
            "SELECT decision_id, outcome, provenance, reason, channel, actor_id, request_digest, resolved_at "
            "FROM human_decision_resolutions",
        )
    }
    digest = rows(
        store, "SELECT request_digest FROM human_decisions WHERE decision_id = ?", open_one.decision_id
    )
    assert stored[open_one.decision_id] == (
        "cancelled",
        "explicit_cancel",
        CANCELLED_TEXT,
        None,
        "host-a",
        digest[0][0],
        ms(500),
    )
    assert stored[answered.decision_id][:2] == ("accepted", "human")
    assert stored[answered.decision_id][4] == "alice"
    assert stored[answered.decision_id][6] == ms(12)
    (first, second) = store.decisions(run_id="run-1")
    assert (first.outcome, first.response) == ("accepted", {"yes": True})
    assert (second.outcome, second.provenance, second.response) == ("cancelled", "explicit_cancel", None)


def test_cancel__rejects_validating_submissions(store: Store, claimed: Callable[..., RunRecord]) -> None:
    _, request_id = waiting_run(store, claimed, park=False)
    earlier = store.submit(request_id=request_id, session_id="session-1", payload={"a": 1}, now=at(30))
    store.submission_resolve(
        run_id="run-1", claim_token=TOKEN, submission_id=earlier.submission_id, accepted=False, now=at(31)
    )
    validating = store.submit(request_id=request_id, session_id="session-1", payload={"a": 2}, now=at(32))
    assert validating.outcome == "validating"
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(500))
    outcomes = {s.submission_id: (s.outcome, s.receipt) for s in store.submissions(request_id)}
    assert outcomes == {
        earlier.submission_id: ("rejected", {"status": "rejected"}),
        validating.submission_id: ("rejected", {"status": "rejected", "error": CANCELLED_TEXT}),
    }
    assert rows(store, "SELECT status, revision FROM interactive_requests") == [("cancelled", 2)]


def test_cancel__cancels_pending_step_decision_and_follow_up_messages_only(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    sent = send_all_kinds(store)
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(500))
    assert message_statuses(store) == {
        sent["step"]: "cancelled",
        sent["decision"]: "cancelled",
        sent["followUp"]: "cancelled",
        sent["notification"]: "pending",
        sent["terminal"]: "pending",
    }


def test_cancel__wrong_token_returns_false_without_the_stale_fallback(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    before = snapshot(store)
    assert not store.cancel(run_id="run-1", claim_token="tok-wrong", now=at(100))
    assert snapshot(store) == before
    # Even once the claim has expired (when a tokenless cancel would succeed), a token that does not
    # hold the claim writes nothing.
    assert not store.cancel(run_id="run-1", claim_token="tok-wrong", now=at(LEASE + 1))
    assert not store.cancel(run_id="run-1", claim_token=TOKEN, now=at(LEASE + 1))
    assert snapshot(store) == before


# -- tokenless cancel --------------------------------------------------------------------------


def test_cancel__tokenless_queued_run_takes_the_terminal_path(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    assert store.cancel(run_id="run-1", now=at(100))
    event = last_event(store)
    assert event["type"] == "run.queue_cancelled"
    assert event["payload"] == {"status": "cancelled", "code": "cancelled", "error": CANCELLED_TEXT}
    assert "staleControl" not in event["payload"]
    assert (event["actor_type"], event["actor_id"], event["generation"]) == ("system", None, None)
    assert lease_row(store)["generation"] == 0
    assert (queue_row(store)["status"], run_row(store)["status"]) == ("cancelled", "cancelled")


def test_cancel__tokenless_parked_run_takes_the_stale_path(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(10))
    assert store.cancel(run_id="run-1", now=at(100))
    event = last_event(store)
    assert event["type"] == "run.queue_cancelled"
    assert event["payload"] == {"status": "cancelled", "code": "cancelled", "staleControl": True}
    assert (event["actor_type"], event["actor_id"], event["generation"]) == ("control", "workflow-control", 2)
    lease = lease_row(store)
    assert (lease["generation"], lease["owner_type"], lease["owner_id"], lease["expires_at"]) == (
        2,
        None,
        None,
        None,
    )
    queue = queue_row(store)
    assert (queue["status"], queue["error_code"], queue["error"], queue["finished_at"]) == (
        "cancelled",
        "cancelled",
        CANCELLED_TEXT,
        ms(100),
    )
    assert run_row(store) == {
        "status": "cancelled",
        "paused": 0,
        "status_detail": None,
        "error": CANCELLED_TEXT,
        "finished_at": ms(100),
    }


@pytest.mark.parametrize("running", [False, True], ids=["starting", "running"])
def test_cancel__tokenless_expired_claim_takes_the_stale_path(
    store: Store, claimed: Callable[..., RunRecord], running: bool
) -> None:
    claimed(running=running)
    attempt = start_attempt(store, now=10) if running else None
    assert store.cancel(run_id="run-1", now=at(LEASE))
    event = last_event(store)
    assert event["payload"]["staleControl"] is True
    assert (event["actor_type"], event["actor_id"], event["generation"]) == ("control", "workflow-control", 2)
    assert lease_row(store)["generation"] == 2
    if attempt is not None:
        assert attempt_rows(store)[attempt]["status"] == "cancelled"


def test_cancel__tokenless_refuses_a_live_claim(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    before = snapshot(store)
    assert not store.cancel(run_id="run-1", now=at(LEASE - 1))
    assert snapshot(store) == before


def test_cancel__stale_path_settles_dependents_as_the_control(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    attempt, request_id = waiting_run(store, claimed)
    assert store.pause_parked(run_id="run-1", now=at(40))
    claim = store.claim_for_control(
        run_id="run-1", runner_id="host-a", claim_token="tok-ctl", lease_ms=LEASE, now=at(50)
    )
    assert claim is not None
    pending = store.effect_enqueue(
        run_id="run-1", claim_token="tok-ctl", effect_type="mail.send", idempotency_key="k1", now=at(55)
    )
    decision = store.decision_open(run_id="run-1", claim_token="tok-ctl", node_id="n", request={}, now=at(56))
    message = store.message_send(run_id="run-1", claim_token="tok-ctl", kind="step", payload={}, now=at(57))
    assert message is not None
    assert store.park(run_id="run-1", claim_token="tok-ctl", now=at(60))
    assert run_row(store)["paused"] == 1
    assert store.cancel(run_id="run-1", now=at(100))
    assert run_row(store)["paused"] == 0
    assert attempt_rows(store)[attempt]["status"] == "cancelled"
    assert rows(
        store, "SELECT status, revision FROM interactive_requests WHERE request_id = ?", request_id
    ) == [("cancelled", 2)]
    stored = effect_row(store, pending.effect_id)
    assert stored["status"] == "cancelled"
    assert resource_events(store, stored["resource_id"])[-1][1:4] == (
        "effect.cancelled",
        "control",
        "workflow-control",
    )
    (found,) = store.decisions(decision_id=decision.decision_id)
    assert (found.outcome, found.provenance, found.actor_id) == (
        "cancelled",
        "explicit_cancel",
        "workflow-control",
    )
    assert message_statuses(store) == {message.message_id: "cancelled"}


# -- cancel_stale ------------------------------------------------------------------------------


def test_cancel_stale__refuses_a_live_run(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    before = snapshot(store)
    assert not store.cancel_stale(run_id="run-1", now=at(LEASE - 1))
    assert snapshot(store) == before


@pytest.mark.parametrize("ending", ["complete", "fail", "cancel"])
def test_cancel_stale__refuses_a_terminal_run(
    store: Store, claimed: Callable[..., RunRecord], ending: str
) -> None:
    claimed()
    if ending == "complete":
        assert store.complete(run_id="run-1", claim_token=TOKEN, now=at(10))
    elif ending == "fail":
        assert store.fail(run_id="run-1", claim_token=TOKEN, error_code="e", error_message="x", now=at(10))
    else:
        assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(10))
    before = snapshot(store)
    assert not store.cancel_stale(run_id="run-1", now=at(100))
    assert not store.cancel_stale(run_id="run-1", control_id="ops", claim_token="t", now=at(LEASE * 3))
    assert snapshot(store) == before


def test_cancel_stale__refuses_a_missing_run(store: Store) -> None:
    before = snapshot(store)
    assert not store.cancel_stale(run_id="nope", now=at(0))
    assert snapshot(store) == before


def test_cancel_stale__defaults_the_control_id_and_consumes_one_generation(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve()
    assert store.cancel_stale(run_id="run-1", now=at(100))
    event = last_event(store)
    assert (event["actor_type"], event["actor_id"], event["generation"]) == ("control", "workflow-control", 1)
    assert event["payload"] == {"status": "cancelled", "code": "cancelled", "staleControl": True}
    lease = lease_row(store)
    assert (lease["generation"], lease["owner_id"]) == (1, None)


def test_cancel_stale__uses_the_given_control_id_and_releases_its_claim(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    decision = store.decision_open(run_id="run-1", claim_token=TOKEN, node_id="n", request={}, now=at(10))
    assert store.cancel_stale(run_id="run-1", control_id="ops-7", claim_token="tok-ops", now=at(LEASE + 10))
    event = last_event(store)
    assert (event["actor_type"], event["actor_id"], event["generation"]) == ("control", "ops-7", 2)
    lease = lease_row(store)
    assert (lease["generation"], lease["owner_type"], lease["owner_id"], lease["token_hash"]) == (
        2,
        None,
        None,
        None,
    )
    assert not store.verify_claim(run_id="run-1", claim_token="tok-ops", now=at(LEASE + 11))
    (found,) = store.decisions(decision_id=decision.decision_id)
    assert (found.provenance, found.actor_id) == ("explicit_cancel", "ops-7")


def test_cancel_stale__refuses_when_the_durable_status_is_terminal(
    store: Store, claimed: Callable[..., RunRecord]
) -> None:
    claimed()
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(10))
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="completed", now=at(20))
    before = snapshot(store)
    assert not store.cancel_stale(run_id="run-1", now=at(LEASE + 1))
    assert snapshot(store) == before


# -- cancelled runs stay cancelled -------------------------------------------------------------


@pytest.mark.parametrize("how", ["token", "queued", "stale"])
def test_cancelled_run__is_never_claimable(
    store: Store, claimed: Callable[..., RunRecord], reserve: Callable[..., RunRecord], how: str
) -> None:
    if how == "queued":
        reserve()
        assert store.cancel(run_id="run-1", now=at(10))
    else:
        claimed()
        if how == "token":
            assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(10))
        else:
            assert store.cancel(run_id="run-1", now=at(LEASE + 10))
    before = snapshot(store)
    for now in (LEASE * 2, LEASE * 100):
        for claim in (store.claim, store.claim_for_interaction_validation, store.claim_for_control):
            assert (
                claim(run_id="run-1", runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(now))
                is None
            )
        assert store.claim_next(runner_id="host-b", claim_token="tok-b", lease_ms=LEASE, now=at(now)) is None
        assert store.claim_next(runner_id="host-a", claim_token="tok-c", lease_ms=LEASE, now=at(now)) is None
    assert snapshot(store) == before


# -- departure 8: a durable terminal status is never overwritten -------------------------------


@pytest.mark.parametrize("durable", ["completed", "failed", "timed_out", "cancelled"])
def test_terminal__never_overwrites_a_terminal_durable_status(
    store: Store, claimed: Callable[..., RunRecord], durable: str
) -> None:
    claimed()
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(10))
    if durable == "completed":
        store.set_run_status(run_id="run-1", claim_token=TOKEN, status=durable, now=at(20))
    else:
        # Only fail()/cancel() reach these, and they finish the queue too: write the state directly.
        write(
            store, "UPDATE runs SET status = ?, finished_at = ? WHERE run_id = 'run-1'", durable, T0_MS + 20
        )
    assert queue_row(store)["status"] == "running"
    before = snapshot(store)
    assert not store.fail(run_id="run-1", claim_token=TOKEN, error_code="e", error_message="x", now=at(30))
    assert not store.cancel(run_id="run-1", claim_token=TOKEN, now=at(30))
    assert not store.cancel(run_id="run-1", now=at(LEASE + 1))
    assert not store.cancel_stale(run_id="run-1", now=at(LEASE + 1))
    assert not store.fail(run_id="run-1", error_code="e", error_message="x", now=at(LEASE + 1))
    assert snapshot(store) == before
    assert run_row(store)["status"] == durable


# -- invariant 5: terminal queue statuses are absorbing ----------------------------------------


@pytest.mark.parametrize("ending", ["complete", "fail", "cancel", "cancel_stale", "fail_queued"])
def test_terminal__queue_status_is_absorbing(
    store: Store, claimed: Callable[..., RunRecord], reserve: Callable[..., RunRecord], ending: str
) -> None:
    if ending == "fail_queued":
        reserve()
        assert store.fail(run_id="run-1", error_code="e", error_message="x", now=at(10))
    else:
        claimed()
        if ending == "complete":
            assert store.complete(run_id="run-1", claim_token=TOKEN, now=at(10))
        elif ending == "fail":
            assert store.fail(
                run_id="run-1", claim_token=TOKEN, error_code="e", error_message="x", now=at(10)
            )
        elif ending == "cancel":
            assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(10))
        else:
            assert store.cancel_stale(run_id="run-1", now=at(LEASE))
    before = snapshot(store)
    later = at(LEASE * 4)
    kwargs: dict[str, Any] = {"runner_id": "host-b", "claim_token": "tok-b", "lease_ms": LEASE, "now": later}
    assert store.claim(run_id="run-1", **kwargs) is None
    assert store.claim_for_interaction_validation(run_id="run-1", **kwargs) is None
    assert store.claim_for_control(run_id="run-1", **kwargs) is None
    assert store.claim_next(**kwargs) is None
    assert not store.fail(run_id="run-1", error_code="e", error_message="x", now=later)
    assert not store.fail(run_id="run-1", claim_token=TOKEN, error_code="e", error_message="x", now=later)
    assert not store.cancel(run_id="run-1", now=later)
    assert not store.cancel(run_id="run-1", claim_token=TOKEN, now=later)
    assert not store.cancel_stale(run_id="run-1", now=later)
    assert not store.request_resume(run_id="run-1", now=later)
    assert not store.pause_parked(run_id="run-1", now=later)
    assert not store.resume_paused_interaction(run_id="run-1", now=later)
    assert not store.mark_running(run_id="run-1", claim_token=TOKEN, now=later)
    assert not store.park(run_id="run-1", claim_token=TOKEN, now=later)
    assert not store.complete(run_id="run-1", claim_token=TOKEN, now=later)
    assert not store.renew(run_id="run-1", claim_token=TOKEN, lease_ms=LEASE, now=later)
    assert not store.delete(run_id="run-1", claim_token=TOKEN, now=later)
    assert snapshot(store) == before


# -- invariant 10: fail and cancel release the claim and settle dependents ---------------------


@pytest.mark.parametrize("ending", ["fail", "cancel", "cancel_stale"])
def test_terminal__leaves_no_claim_and_no_active_dependents(
    store: Store, claimed: Callable[..., RunRecord], ending: str
) -> None:
    attempt, _ = waiting_run(store, claimed, park=False)
    store.effect_enqueue(run_id="run-1", claim_token=TOKEN, effect_type="t", idempotency_key="k", now=at(30))
    store.message_send(run_id="run-1", claim_token=TOKEN, kind="decision", payload={}, now=at(31))
    if ending == "fail":
        assert store.fail(run_id="run-1", claim_token=TOKEN, error_code="e", error_message="x", now=at(100))
    elif ending == "cancel":
        assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(100))
    else:
        assert store.cancel_stale(run_id="run-1", now=at(LEASE + 100))
    lease = lease_row(store)
    assert lease["owner_id"] is None and lease["token_hash"] is None
    assert rows(
        store,
        "SELECT count(*) FROM node_attempts WHERE status IN ('pending', 'running', 'waiting', 'interrupted')",
    ) == [(0,)]
    assert rows(store, "SELECT count(*) FROM interactive_requests WHERE status = 'pending'") == [(0,)]
    assert rows(store, "SELECT count(*) FROM workflow_messages WHERE status = 'pending'") == [(0,)]
    assert open_intervals(store) == 0
    pending_effects = rows(store, "SELECT count(*) FROM effects WHERE status IN ('pending', 'applying')")
    assert pending_effects == [(1,)] if ending == "fail" else pending_effects == [(0,)]
    assert attempt_rows(store)[attempt]["status"] == ("failed" if ending == "fail" else "cancelled")


# -- delete ------------------------------------------------------------------------------------


def test_delete__removes_the_run_its_events_and_its_effects(
    store: Store, claimed: Callable[..., RunRecord], reserve: Callable[..., RunRecord]
) -> None:
    reserve("run-2", origin_session_id="session-2")
    other = snapshot(store)
    claimed()
    effect = store.effect_enqueue(
        run_id="run-1", claim_token=TOKEN, effect_type="t", idempotency_key="k", now=at(10)
    )
    store.effect_begin(run_id="run-1", claim_token=TOKEN, effect_id=effect.effect_id, now=at(11))
    attempt = start_attempt(store, now=12)
    store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt, now=at(12))
    store.decision_open(run_id="run-1", claim_token=TOKEN, node_id="n", request={}, now=at(13))
    store.message_send(run_id="run-1", claim_token=TOKEN, kind="step", payload={}, now=at(14))
    store.record_event(run_id="run-1", workflow_ref="builtin:demo", type="custom", now=at(15))
    newest = store.last_event_seq()
    assert store.delete(run_id="run-1", claim_token=TOKEN, now=at(100))
    assert store.get_run("run-1") is None
    assert store.events_after(0, run_id="run-1") == []
    assert store.effects(run_id="run-1") == []
    after = snapshot(store)
    for table in (
        "events",
        "resources",
        "leases",
        "runs",
        "run_queue",
        "run_bindings",
        "run_sources",
        "viewer_runs",
    ):
        assert after[table] == other[table], table
    for table in (
        "effects",
        "effect_attempts",
        "node_attempts",
        "attempt_active_intervals",
        "human_decisions",
        "workflow_messages",
        "viewer_revisions",
    ):
        assert after[table] == [], table
    # Delete writes no event and the global sequence keeps rising past the removed entries.
    assert store.last_event_seq() < newest
    event = store.record_event(run_id="run-2", workflow_ref="builtin:demo", type="custom", now=at(200))
    assert event.seq > newest


@pytest.mark.parametrize(
    ("token", "now"),
    [
        pytest.param("tok-wrong", 100, id="wrong-token"),
        pytest.param(TOKEN, LEASE, id="expired"),
    ],
)
def test_delete__needs_a_live_matching_claim(
    store: Store, claimed: Callable[..., RunRecord], token: str, now: int
) -> None:
    claimed()
    before = snapshot(store)
    assert not store.delete(run_id="run-1", claim_token=token, now=at(now))
    assert snapshot(store) == before


def test_delete__refuses_an_unowned_or_missing_run(store: Store, claimed: Callable[..., RunRecord]) -> None:
    claimed()
    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(10))
    before = snapshot(store)
    assert not store.delete(run_id="run-1", claim_token=TOKEN, now=at(20))
    assert not store.delete(run_id="nope", claim_token=TOKEN, now=at(20))
    assert snapshot(store) == before


def test_delete__refuses_a_run_that_restart_children_point_at(
    store: Store, claimed: Callable[..., RunRecord], reserve: Callable[..., RunRecord]
) -> None:
    claimed()
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(10))
    reserve(
        "run-1b",
        parent_run_id="run-1",
        lineage_kind="restart",
        parent_run_revision=run_revision(store),
        now=at(20),
    )
    # A terminal parent cannot be claimed, so delete is refused before it looks at children.
    before = snapshot(store)
    assert not store.delete(run_id="run-1", claim_token=TOKEN, now=at(30))
    assert snapshot(store) == before
    # Were the parent held by a live claim, the children still block it.
    write(
        store,
        "UPDATE leases SET owner_type = 'host', owner_id = 'host-a', token_hash = ?, acquired_at = ?, "
        "heartbeat_at = ?, expires_at = ? "
        "WHERE resource_id = (SELECT resource_id FROM runs WHERE run_id = 'run-1')",
        token_hash("tok-again"),
        ms(30),
        ms(30),
        ms(30 + LEASE),
    )
    before = snapshot(store)
    with pytest.raises(Conflict, match="restart children"):
        store.delete(run_id="run-1", claim_token="tok-again", now=at(40))
    assert snapshot(store) == before


def test_delete__of_a_restart_child_keeps_its_parent(
    store: Store, claimed: Callable[..., RunRecord], reserve: Callable[..., RunRecord]
) -> None:
    claimed()
    assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(10))
    reserve(
        "run-1b",
        parent_run_id="run-1",
        lineage_kind="restart",
        parent_run_revision=run_revision(store),
        now=at(20),
    )
    parent_events = run_events(store, "run-1")
    assert store.claim(run_id="run-1b", runner_id="host-a", claim_token="tok-b", lease_ms=LEASE, now=at(30))
    assert store.delete(run_id="run-1b", claim_token="tok-b", now=at(40))
    assert store.get_run("run-1b") is None
    assert run_events(store, "run-1") == parent_events
    record = store.get_run("run-1")
    assert record is not None and record.status == "cancelled"


@pytest.mark.parametrize("ending", ["fail", "cancel", "cancel_stale"])
def test_terminal__stamps_the_run_finish_time_of_a_waiting_run(
    store: Store, claimed: Callable[..., RunRecord], ending: str
) -> None:
    waiting_run(store, claimed, park=ending == "cancel_stale")
    assert run_row(store)["status"] == "waiting"
    assert run_row(store)["finished_at"] == ms(20)
    if ending == "fail":
        assert store.fail(run_id="run-1", claim_token=TOKEN, error_code="e", error_message="x", now=at(500))
    elif ending == "cancel":
        assert store.cancel(run_id="run-1", claim_token=TOKEN, now=at(500))
    else:
        assert store.cancel_stale(run_id="run-1", now=at(500))
    assert run_row(store)["finished_at"] == ms(500)
    assert queue_row(store)["finished_at"] == ms(500)
