"""Decisions (answered, defaulted, expired) and origin-session input (validated submissions,
active-time deadlines that stop while paused)."""

from __future__ import annotations

import time

import pytest

from tether.engine.graph import Workflow, compute, decision, input
from tether.engine.runner import Runner
from tether.errors import Conflict, InvalidInput, NotFound, StoreBusy

from .conftest import Engine, wait_until


def passthrough(ctx):  # type: ignore[no-untyped-def]
    return {"node": ctx.node_id}


# -- decisions -------------------------------------------------------------------------------
def _approval(name: str, **kwargs) -> Workflow:  # type: ignore[no-untyped-def]
    return Workflow(
        name,
        start="prep",
        nodes=[
            compute("prep", lambda ctx: {"version": "1.2.3"}),
            decision("approve", "Ship 1.2.3?", options=["ship", "hold"], **kwargs),
            compute("ship", passthrough),
            compute("hold", passthrough),
        ],
        edges={"prep": "approve", "approve.ship": "ship", "approve.hold": "hold"},
    )


def _open_decision(engine: Engine, run_id: str):  # type: ignore[no-untyped-def]
    return wait_until(lambda: engine.client.decisions(run_id), what="an open decision")[0]


def test_decision__answer_continues_on_the_chosen_exit(engine: Engine) -> None:
    engine.register(_approval("approval"))
    engine.runner()
    run = engine.client.start("approval", session_id="session-decide")
    opened = _open_decision(engine, run.run_id)
    assert opened.node_id == "approve"
    assert opened.request["question"] == "Ship 1.2.3?"
    assert opened.request["options"] == ["ship", "hold"]
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to wait")
    messages = engine.client.session("session-decide").messages()
    assert [m.kind for m in messages] == ["decision"]
    assert messages[0].payload["decisionId"] == opened.decision_id

    answered = engine.client.answer(opened.decision_id, "hold", actor_id="alice")
    assert (answered.outcome, answered.provenance, answered.actor_id) == ("accepted", "human", "alice")
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"node": "hold"}
    nodes = [(a.node_id, a.exit_name) for a in engine.attempts(run.run_id)]
    assert nodes == [("prep", "ok"), ("approve", "hold"), ("hold", "ok")]
    assert engine.attempts(run.run_id, "approve")[0].output == {"response": "hold", "provenance": "human"}


def test_decision__invalid_option_is_refused_and_nothing_is_written(engine: Engine) -> None:
    engine.register(_approval("approval-bad"))
    engine.runner()
    run = engine.client.start("approval-bad")
    opened = _open_decision(engine, run.run_id)
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to wait")
    before = engine.store.last_event_seq()
    with pytest.raises(InvalidInput, match="Answer must be one of ship, hold"):
        engine.client.answer(opened.decision_id, "maybe")
    assert engine.store.last_event_seq() == before
    assert engine.client.decisions(run.run_id)[0].outcome is None
    assert engine.statuses(run.run_id) == ("parked", "waiting")

    engine.client.answer(opened.decision_id, "ship")
    assert engine.wait(run.run_id).output == {"node": "ship"}
    with pytest.raises(Conflict, match="already resolved"):
        engine.client.answer(opened.decision_id, "hold")
    with pytest.raises(NotFound):
        engine.client.answer("decision-missing", "ship")


def test_decision__schema_answer_is_validated_and_exits_ok(engine: Engine) -> None:
    wf = Workflow(
        "budget",
        start="ask",
        nodes=[
            decision(
                "ask",
                "Budget?",
                schema={
                    "type": "object",
                    "properties": {"amount": {"type": "integer", "minimum": 1}},
                    "required": ["amount"],
                },
            ),
            compute("use", lambda ctx: {"amount": ctx.outputs["ask"]["response"]["amount"]}),
        ],
        edges={"ask.ok": "use"},
    )
    engine.register(wf)
    engine.runner()
    run = engine.client.start("budget")
    opened = _open_decision(engine, run.run_id)
    with pytest.raises(InvalidInput, match=r"\$\.amount: less than 1"):
        engine.client.answer(opened.decision_id, {"amount": 0})
    with pytest.raises(InvalidInput, match=r"\$\.amount: required"):
        engine.client.answer(opened.decision_id, {})
    engine.client.answer(opened.decision_id, {"amount": 7})
    assert engine.wait(run.run_id).output == {"amount": 7}
    assert engine.attempts(run.run_id, "ask")[0].exit_name == "ok"


def test_decision__default_applies_after_deadline(engine: Engine) -> None:
    engine.register(_approval("approval-default", deadline_s=0.3, default="hold"))
    engine.runner()
    started = time.monotonic()
    run = engine.client.start("approval-default")
    result = engine.wait(run.run_id)
    assert time.monotonic() - started >= 0.3
    assert result.status == "done"
    assert result.output == {"node": "hold"}
    (resolved,) = engine.client.decisions(run.run_id, open_only=False)
    assert (resolved.outcome, resolved.provenance, resolved.response) == (
        "accepted",
        "timeout_policy",
        "hold",
    )
    assert engine.attempts(run.run_id, "approve")[0].output == {
        "response": "hold",
        "provenance": "timeout_policy",
    }


def test_decision__deadline_without_default_fails_decision_expired(engine: Engine) -> None:
    engine.register(_approval("approval-expire", deadline_s=0.3))
    engine.runner()
    run = engine.client.start("approval-expire")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert result.error_code == "decisionExpired"
    (resolved,) = engine.client.decisions(run.run_id, open_only=False)
    assert (resolved.outcome, resolved.provenance) == ("cancelled", "expired_no_default")
    assert engine.attempts(run.run_id, "approve")[0].status == "timed_out"
    assert [a.node_id for a in engine.attempts(run.run_id)] == ["prep", "approve"]


def test_decision__cancel_while_waiting_resolves_it_explicit_cancel(engine: Engine) -> None:
    engine.register(_approval("approval-cancel"))
    engine.runner()
    run = engine.client.start("approval-cancel")
    opened = _open_decision(engine, run.run_id)
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to wait")
    assert engine.client.cancel(run.run_id) == "cancelled"
    assert engine.statuses(run.run_id) == ("cancelled", "cancelled")
    (resolved,) = engine.client.decisions(run.run_id, open_only=False)
    assert (resolved.decision_id, resolved.provenance) == (opened.decision_id, "explicit_cancel")
    with pytest.raises(Conflict, match="already cancelled"):
        engine.client.cancel(run.run_id)


# -- input -----------------------------------------------------------------------------------
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "minLength": 1}},
    "required": ["answer"],
    "additionalProperties": False,
}


def _interview(name: str, **kwargs) -> Workflow:  # type: ignore[no-untyped-def]
    return Workflow(
        name,
        start="ask",
        nodes=[
            input("ask", "What should we build?", schema=ANSWER_SCHEMA, **kwargs),
            compute("use", lambda ctx: {"got": ctx.outputs["ask"]}),
        ],
        edges={"ask": "use"},
    )


def test_input__session_sees_the_request_and_a_step_message(engine: Engine) -> None:
    engine.register(_interview("interview"))
    engine.runner()
    session = engine.client.session("session-in")
    run = session.start("interview")
    (request,) = wait_until(session.pending_inputs, what="a pending input request")
    assert request.run_id == run.run_id
    assert request.payload == {"prompt": "What should we build?", "schema": ANSWER_SCHEMA}
    (message,) = session.messages()
    assert message.kind == "step"
    assert message.payload == {"prompt": "What should we build?", "requestId": request.request_id}
    assert engine.statuses(run.run_id) == ("parked", "waiting")
    # Another session cannot answer it.
    with pytest.raises(Conflict, match="belongs to another session"):
        engine.client.submit(request.request_id, "session-other", {"answer": "x"})
    # Acknowledged messages are no longer pending.
    assert session.ack(message.message_id) is True
    assert session.ack(message.message_id) is False
    assert session.messages() == []
    assert [m.status for m in session.messages(pending_only=False)] == ["sent"]


def test_input__invalid_submission_is_rejected_and_the_run_keeps_waiting(engine: Engine) -> None:
    engine.register(_interview("interview-bad"))
    runner = engine.runner()
    session = engine.client.session("session-bad")
    run = session.start("interview-bad")
    (request,) = wait_until(session.pending_inputs, what="a pending input request")

    # The session refuses it at once, naming the fields, and writes nothing.
    with pytest.raises(InvalidInput, match=r"\$\.answer: shorter than 1 characters; \$\.extra: not allowed"):
        session.submit(request.request_id, {"answer": "", "extra": 1})
    assert engine.store.submissions(request.request_id) == []
    # Submitted to the store directly (past the client), the runner rejects it in turn.
    submission = engine.store.submit(
        request_id=request.request_id, session_id="session-bad", payload={"answer": "", "extra": 1}
    )
    assert submission.outcome == "validating"

    def settled():  # type: ignore[no-untyped-def]
        found = engine.store.submissions(request.request_id)
        return found if found[0].outcome != "validating" else None

    (rejected,) = wait_until(settled, what="the submission to be validated")
    assert rejected.outcome == "rejected"
    assert rejected.receipt["status"] == "rejected"
    assert sorted(rejected.receipt["errors"]) == [
        "$.answer: shorter than 1 characters",
        "$.extra: not allowed",
    ]
    wait_until(lambda: not runner.active_run_ids, what="the runner to release the run")
    assert engine.statuses(run.run_id) == ("parked", "waiting")
    assert [r.request_id for r in session.pending_inputs()] == [request.request_id]
    step_messages = [m.payload for m in session.messages() if m.kind == "step"]
    assert step_messages[-1]["rejected"] == rejected.receipt["errors"]
    assert engine.attempts(run.run_id, "ask")[0].status == "waiting"

    session.submit(request.request_id, {"answer": "a durable queue"})
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"got": {"value": {"answer": "a durable queue"}, "provenance": "human"}}
    assert [s.outcome for s in engine.store.submissions(request.request_id)] == ["rejected", "accepted"]
    assert session.pending_inputs() == []


def test_input__headless_start_is_refused_and_writes_nothing(engine: Engine) -> None:
    engine.register(_interview("interview-headless"))
    with pytest.raises(InvalidInput, match=r"interview-headless talks to its run's session \(nodes ask\)"):
        engine.client.start("interview-headless", run_id="run-headless")
    assert engine.store.get_run("run-headless") is None
    assert engine.event_types("run-headless") == []


def test_input__deadline_without_default_fails_input_expired(engine: Engine) -> None:
    engine.register(_interview("interview-expire", timeout_s=0.3))
    engine.runner()
    session = engine.client.session("session-expire")
    run = session.start("interview-expire")
    result = engine.wait(run.run_id)
    assert result.status == "failed"
    assert result.error_code == "inputExpired"
    (request,) = engine.store.requests(run_id=run.run_id)
    assert request.status == "cancelled"
    assert engine.attempts(run.run_id, "ask")[0].status == "timed_out"
    with pytest.raises(Conflict, match="not pending"):
        session.submit(request.request_id, {"answer": "too late"})


def test_input__pause_stops_the_deadline_clock(engine: Engine) -> None:
    timeout_s = 0.5
    engine.register(_interview("interview-pause", timeout_s=timeout_s, default={"answer": "default"}))
    engine.runner()
    session = engine.client.session("session-pause")
    run = session.start("interview-pause")
    wait_until(session.pending_inputs, interval=0.002, what="a pending input request")
    engine.client.pause(run.run_id)
    view = engine.store.get_run_view(run.run_id)
    assert view is not None and view.paused
    used_ms = engine.attempts(run.run_id, "ask")[0].elapsed_ms
    assert used_ms < timeout_s * 1000

    # Well past the deadline in wall time: a paused run never times out.
    time.sleep(timeout_s * 2)
    view = engine.store.get_run_view(run.run_id)
    assert view is not None
    assert (view.status, view.run_state_status, view.paused) == ("parked", "waiting", True)
    assert len(session.pending_inputs()) == 1
    assert engine.attempts(run.run_id, "ask")[0].elapsed_ms == used_ms

    resumed = time.monotonic()
    engine.client.resume(run.run_id)
    result = engine.wait(run.run_id)
    # The clock resumed where it stopped: the remaining active time had to pass first.
    assert time.monotonic() - resumed >= (timeout_s * 1000 - used_ms) / 1000 - 0.05
    assert result.status == "done"
    assert result.output == {"got": {"value": {"answer": "default"}, "provenance": "timeout_policy"}}
    assert engine.attempts(run.run_id, "ask")[0].elapsed_ms >= timeout_s * 1000


def test_input__pause_is_refused_for_a_run_not_waiting_on_input(engine: Engine) -> None:
    engine.register(_approval("approval-pause"))
    engine.runner()
    run = engine.client.start("approval-pause")
    _open_decision(engine, run.run_id)
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to wait")
    with pytest.raises(Conflict, match="cannot be paused"):
        engine.client.pause(run.run_id)


def test_decision__answered_while_the_session_runs_another_run_continues_after_it(engine: Engine) -> None:
    latch = engine.latch()
    other = Workflow("busy", start="hold", nodes=[compute("hold", lambda ctx: latch.hold())])
    engine.register(_approval("approval-busy"), other)
    engine.runner()
    session = engine.client.session("session-busy-answer")
    run = session.start("approval-busy")
    opened = _open_decision(engine, run.run_id)
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to wait")
    busy = session.start("busy")
    assert latch.entered.wait(10)
    engine.client.answer(opened.decision_id, "ship")
    latch.release.set()
    assert engine.wait(busy.run_id).status == "done"
    assert engine.wait(run.run_id, timeout=3).output == {"node": "ship"}


def test_input__an_answer_to_a_paused_run_waits_for_resume_and_the_next_wait_is_not_paused(
    engine: Engine,
) -> None:
    wf = Workflow(
        "two-questions",
        start="one",
        nodes=[input("one", "First?"), input("two", "Second?", timeout_s=0.3, default="fallback")],
        edges={"one": "two"},
    )
    engine.register(wf)
    runner = engine.runner()
    session = engine.client.session("session-two")
    run = session.start("two-questions")
    (first,) = wait_until(session.pending_inputs, what="the first question")
    engine.client.pause(run.run_id)
    submission = session.submit(first.request_id, "first answer")
    time.sleep(0.2)  # several claim rounds: none validates the answer of a paused run
    assert engine.store.submissions(first.request_id)[0].outcome == "validating"
    assert runner.active_run_ids == []
    assert engine.attempts(run.run_id, "two") == []

    engine.client.resume(run.run_id)
    result = engine.wait(run.run_id)
    assert engine.store.submissions(first.request_id)[0].submission_id == submission.submission_id
    assert engine.store.submissions(first.request_id)[0].outcome == "accepted"
    assert result.output == {"value": "fallback", "provenance": "timeout_policy"}


def test_input__cancel_while_waiting_cancels_the_request(engine: Engine) -> None:
    engine.register(_interview("interview-cancel"))
    engine.runner()
    session = engine.client.session("session-cancel")
    run = session.start("interview-cancel")
    (request,) = wait_until(session.pending_inputs, what="a pending input request")
    assert engine.client.cancel(run.run_id) == "cancelled"
    assert engine.store.requests(run_id=run.run_id)[0].status == "cancelled"
    assert session.pending_inputs() == []
    assert [m.status for m in session.messages(pending_only=False) if m.kind == "step"] == ["cancelled"]
    with pytest.raises(Conflict, match="not pending"):
        session.submit(request.request_id, {"answer": "too late"})


# -- timers swept by a busy runner -----------------------------------------------------------
def test_input__a_deadline_waits_for_a_free_slot_of_a_full_runner(engine: Engine) -> None:
    """The runner's one slot is held by another run when an input deadline passes: the timeout
    is not started beside it (the runner would hold two runs), but once the slot is free."""
    latch = engine.latch()

    def held(ctx):  # type: ignore[no-untyped-def]
        latch.hold()
        return {}

    engine.register(
        _interview("interview-full", timeout_s=1.0, default={"answer": "default"}),
        Workflow("hold-slot", start="held", nodes=[compute("held", held)]),
    )
    runner = engine.runner(concurrency=1)
    session = engine.client.session("session-full")
    run = session.start("interview-full")
    wait_until(session.pending_inputs, interval=0.002, what="a pending input request")
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to wait")
    holder = engine.client.start("hold-slot")
    assert latch.entered.wait(10)

    time.sleep(1.5)  # past the deadline, with sweeps every 100 ms
    assert runner.active_run_ids == [holder.run_id]
    assert engine.statuses(run.run_id) == ("parked", "waiting")
    latch.release.set()
    result = engine.wait(run.run_id)
    assert result.status == "done"
    assert result.output == {"got": {"value": {"answer": "default"}, "provenance": "timeout_policy"}}


def test_decision__defaults_apply_while_the_runner_cannot_claim(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store refusal of every claim (a busy database, say) does not stop the timer sweep that
    follows it: an expired decision still gets its default."""
    engine.register(_approval("approval-refused", deadline_s=0.3, default="hold"))
    first = engine.runner()
    run = engine.client.start("approval-refused")
    _open_decision(engine, run.run_id)
    wait_until(lambda: engine.statuses(run.run_id) == ("parked", "waiting"), what="the run to wait")
    engine.stop(first)

    def refused(self: Runner) -> bool:
        raise StoreBusy("The database is locked by another writer; retry the call")

    monkeypatch.setattr(Runner, "_claim_some", refused)
    engine.runner()
    wait_until(
        lambda: not engine.client.decisions(run.run_id),
        what="the expired decision to take its default",
    )
    (resolved,) = engine.client.decisions(run.run_id, open_only=False)
    assert (resolved.outcome, resolved.provenance, resolved.response) == (
        "accepted",
        "timeout_policy",
        "hold",
    )
    assert [a.node_id for a in engine.attempts(run.run_id)] == ["prep", "approve"], "no claim, no step"
