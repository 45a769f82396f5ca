"""Deadlines the store enforces: an answer to a decision or an input request after its deadline
is refused in the answering transaction (writing nothing); a run past its deadline ends
``timed_out``, under its claim or, when nobody holds it, under a control claim; a timed-out
attempt can no longer be settled (a late result is fenced out)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tether.errors import ClaimLost, Conflict, DeadlinePassed
from tether.store import RunRecord, Store

from .conftest import DIGEST, LEASE, at, snapshot

Claimed = Callable[..., RunRecord]
TOKEN = "tok-run-1"


def _decision(store: Store, claimed: Claimed, *, default: object = "hold") -> str:
    claimed()
    store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="approve", now=at(1))
    decision = store.decision_open(
        run_id="run-1",
        claim_token=TOKEN,
        node_id="approve",
        request={"question": "Ship?", "options": ["ship", "hold"], "default": default},
        deadline_at=at(1_000),
        now=at(1),
    )
    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(2))
    return decision.decision_id


def test_decision_resolve__a_human_answer_after_the_deadline_is_refused_and_writes_nothing(
    store: Store, claimed: Claimed
) -> None:
    decision_id = _decision(store, claimed)
    before = snapshot(store)
    with pytest.raises(DeadlinePassed) as refused:
        store.decision_resolve(
            decision_id=decision_id, outcome="accepted", provenance="human", response="ship", now=at(1_000)
        )
    assert str(refused.value) == (
        f"Decision {decision_id} closed at 2026-01-01T00:00:01.000Z: its deadline passed; "
        'the default "hold" applies'
    )
    assert isinstance(refused.value, Conflict)  # the CLI's and the HTTP API's conflict
    assert snapshot(store) == before
    # Just before the deadline a person is still in time.
    resolved = store.decision_resolve(
        decision_id=decision_id, outcome="accepted", provenance="human", response="ship", now=at(999)
    )
    assert resolved is not None and resolved.response == "ship"


def test_decision_resolve__the_timeout_policy_applies_after_the_deadline(
    store: Store, claimed: Claimed
) -> None:
    decision_id = _decision(store, claimed, default=None)
    with pytest.raises(DeadlinePassed, match="it has no default, so its node fails"):
        store.decision_resolve(
            decision_id=decision_id, outcome="accepted", provenance="human", response="ship", now=at(5_000)
        )
    resolved = store.decision_resolve(
        decision_id=decision_id,
        outcome="cancelled",
        provenance="expired_no_default",
        reason="The decision deadline passed without a default",
        now=at(5_000),
    )
    assert resolved is not None and resolved.provenance == "expired_no_default"


def test_submit__an_answer_after_the_active_time_deadline_is_refused_and_writes_nothing(
    store: Store, claimed: Claimed
) -> None:
    claimed()
    store.set_run_status(run_id="run-1", claim_token=TOKEN, status="running", now=at(1))
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="ask", timeout_ms=500, now=at(1))
    request = store.request_open(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt.attempt_id,
        kind="input",
        payload={"prompt": "Name?", "schema": None, "default": {"name": "anon"}},
        now=at(1),
    )
    store.interval_open(run_id="run-1", claim_token=TOKEN, attempt_id=attempt.attempt_id, now=at(1))
    assert store.park(run_id="run-1", claim_token=TOKEN, now=at(2))
    before = snapshot(store)
    with pytest.raises(DeadlinePassed) as refused:
        store.submit(
            request_id=request.request_id, session_id="session-1", payload={"name": "x"}, now=at(501)
        )
    assert str(refused.value) == (
        f"Input request {request.request_id} closed: its deadline of 0.5 s of active time passed; "
        'the default {"name":"anon"} applies'
    )
    assert snapshot(store) == before
    submitted = store.submit(
        request_id=request.request_id, session_id="session-1", payload={"name": "x"}, now=at(500)
    )
    assert submitted.outcome == "validating"


def test_time_out__under_the_claim_ends_the_run_timed_out_with_its_attempt(
    store: Store, claimed: Claimed
) -> None:
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="slow", now=at(1))
    assert store.time_out(
        run_id="run-1", claim_token=TOKEN, error_message="Workflow run run-1 passed", now=at(5)
    )
    view = store.get_run_view("run-1")
    assert view is not None
    assert (view.status, view.run_state_status, view.error_code) == ("failed", "timed_out", "runTimedOut")
    (ended,) = store.attempts("run-1")
    assert (ended.attempt_id, ended.status) == (attempt.attempt_id, "timed_out")
    # The late result of the step that was running is refused: its claim ended with the run.
    with pytest.raises(ClaimLost):
        store.attempt_finish(
            run_id="run-1",
            claim_token=TOKEN,
            attempt_id=attempt.attempt_id,
            status="completed",
            output={"late": True},
            now=at(6),
        )
    assert store.attempts("run-1")[0].output is None


def test_attempt_finish__a_timed_out_attempt_cannot_be_completed_late(store: Store, claimed: Claimed) -> None:
    """The runner records an abandoned step timed out and goes on under the same claim: the
    step's late completion is refused by the store, whose attempt it no longer is."""
    claimed()
    attempt = store.attempt_start(run_id="run-1", claim_token=TOKEN, node_id="slow", now=at(1))
    store.attempt_finish(
        run_id="run-1",
        claim_token=TOKEN,
        attempt_id=attempt.attempt_id,
        status="timed_out",
        exit_name="timeout",
        error_message="timed out after 1 s",
        now=at(2),
    )
    before = snapshot(store)
    with pytest.raises(Conflict, match=f"Node attempt {attempt.attempt_id} is not active"):
        store.attempt_finish(
            run_id="run-1",
            claim_token=TOKEN,
            attempt_id=attempt.attempt_id,
            status="completed",
            output={"late": True},
            now=at(3),
        )
    assert snapshot(store) == before


def test_time_out__without_a_claim_ends_a_waiting_run_and_closes_its_decision(
    store: Store, claimed: Claimed
) -> None:
    decision_id = _decision(store, claimed)
    assert store.time_out(run_id="run-1", error_message="Workflow run run-1 passed its deadline", now=at(3))
    view = store.get_run_view("run-1")
    assert view is not None
    assert (view.status, view.run_state_status) == ("failed", "timed_out")
    (closed,) = store.decisions(decision_id=decision_id)
    assert (closed.outcome, closed.provenance, closed.reason) == (
        "cancelled",
        "expired_no_default",
        "Workflow run timed out",
    )
    assert [a.status for a in store.attempts("run-1")] == ["timed_out"]
    # Once: a finished run does not time out again.
    assert not store.time_out(run_id="run-1", error_message="again", now=at(4))


def test_time_out__without_a_claim_leaves_a_run_a_live_claim_holds(store: Store, claimed: Claimed) -> None:
    claimed()
    before = snapshot(store)
    assert not store.time_out(run_id="run-1", error_message="too soon", now=at(LEASE - 1))
    assert snapshot(store) == before
    # Once the holder's lease lapsed (a dead runner), it is anybody's to end.
    assert store.time_out(run_id="run-1", error_message="passed", now=at(LEASE + 1))
    assert store.get_run_view("run-1").run_state_status == "timed_out"  # type: ignore[union-attr]


def test_runs_past_deadline__unfinished_runs_of_the_definition_started_long_enough_ago(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve("run-1", now=at(0))
    reserve("run-2", origin_session_id="session-2", now=at(500))
    reserve("run-3", origin_session_id="session-3", now=at(0))
    assert store.cancel(run_id="run-3", now=at(1))
    assert store.runs_past_deadline(definition_digest=DIGEST, timeout_ms=1_000, now=at(999)) == []
    assert store.runs_past_deadline(definition_digest=DIGEST, timeout_ms=1_000, now=at(1_000)) == ["run-1"]
    assert store.runs_past_deadline(definition_digest=DIGEST, timeout_ms=1_000, now=at(1_500)) == [
        "run-1",
        "run-2",
    ]
    other = "sha256:" + "0" * 64
    assert store.runs_past_deadline(definition_digest=other, timeout_ms=1_000, now=at(1_500)) == []


def test_time_out__a_queued_run_times_out_without_ever_running(
    store: Store, reserve: Callable[..., RunRecord]
) -> None:
    reserve("run-1", now=at(0))
    assert store.time_out(run_id="run-1", error_message="Workflow run run-1 passed its deadline", now=at(5))
    view = store.get_run_view("run-1")
    assert view is not None
    assert (view.status, view.run_state_status, view.error_code) == ("failed", "timed_out", "runTimedOut")
    assert view.error_message == "Workflow run run-1 passed its deadline"
    assert store.attempts("run-1") == []
